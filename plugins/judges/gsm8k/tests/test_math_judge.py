"""The `math` judge on tricky answers, and the GSM8K data path end to end (real `datasets` loading)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agenttune_gsm8k.judges import GSM8KJudge, MathJudge, MathJudgeOptions, MissingGroundTruth

from agenttune.plugin_api import (
    JudgeConfig,
    JudgeInput,
    Task,
    TaskReaderConfig,
    WorkflowOutput,
    component_options,
    get_component,
)
from agenttune.testing.gsm8k import GSM8K_ROWS as FIRST_TRAIN_ROWS

GSM8K_ROWS = [
    *FIRST_TRAIN_ROWS,  # and two with answers GSM8K writes less often: a thousands separator, a decimal
    {"question": "A shop sold 1,250 pens on Monday and 750 on Tuesday. How many pens did it sell?",
     "answer": "1250 + 750 = <<1250+750=2000>>2000\n#### 2,000"},
    {"question": "A rope is 5 m long and is cut into 4 equal pieces. How long is each piece in metres?",
     "answer": "5 / 4 = <<5/4=1.25>>1.25\n#### 1.25"},
]


def judge_input(answer: str | None, *, gold: dict[str, Any] | None = None, handed: Any = None,
                last_text: str = "") -> JudgeInput:
    metadata = gold if gold is not None else {"ground_truth": "72"}
    output = WorkflowOutput(metadata={} if answer is None else {"final_answer": answer})
    handed_dict = {} if handed is None else {"final_answer": handed}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": last_text}] if last_text else []
    return JudgeInput(task=Task(task_id="t", query="q", metadata=metadata), output=output, handed=handed_dict,
                      messages=messages)


@pytest.fixture(scope="module")
def judge() -> Iterator[MathJudge]:
    judge = MathJudge(MathJudgeOptions(verify_timeout=3.0))
    yield judge
    judge.verifier.close()


@pytest.mark.parametrize(("gold", "answer", "correct", "form"), [
    ("1234", r"The total is \boxed{1,234}.", True, "boxed"),                 # thousands separator
    ("2,000", "They sold 2000 pens.\n#### 2000", True, "hash"),               # comma in the gold
    ("10", "She earned $10.00.\n#### $10", True, "hash"),                     # dollar signs, decimals
    ("1.25", r"Each piece is \boxed{1.250} m", True, "boxed"),               # trailing zero
    ("0.5", r"\boxed{\frac{1}{2}}", True, "boxed"),                          # fraction vs decimal
    ("72", "April 48, May 24, so 48 + 24 = 72 in all.", True, "none"),        # several numbers, last counts
    ("72", "48 in April, 24 in May: total 70. \\boxed{70}", False, "boxed"),  # wrong
    ("72", r"I first thought \boxed{70}, but recounting gives \boxed{72}", True, "boxed"),
    ("72", "I cannot solve this.", False, "none"),
    ("72", "", False, "none"),
])
def test_tricky_answers(judge: MathJudge, gold: str, answer: str, correct: bool, form: str) -> None:
    result = judge.judge(judge_input(answer, gold={"ground_truth": gold}))
    assert result.success is correct, result.details
    assert result.reward == (1.0 if correct else 0.0)
    assert result.details["answer_format"] == form
    assert result.details["format_ok"] == (0.0 if form == "none" else 1.0)


def test_handed_answer_wins_over_output_and_last_message(judge: MathJudge) -> None:
    result = judge.judge(judge_input(r"\boxed{5}", handed=r"\boxed{72}", last_text="the answer is 9"))
    assert result.success is True and result.details["answer"] == "72"


def test_last_assistant_text_when_nothing_is_handed(judge: MathJudge) -> None:
    result = judge.judge(judge_input(None, last_text="So she sold 72 clips.\n#### 72"))
    assert result.success is True
    assert result.details["method"] == "math_verify"


def test_ground_truth_from_a_raw_gsm8k_answer(judge: MathJudge) -> None:
    result = judge.judge(judge_input("#### 72", gold={"answer": GSM8K_ROWS[0]["answer"]}))
    assert result.success is True and result.details["ground_truth"] == "72"


def test_missing_ground_truth_is_a_clear_error(judge: MathJudge) -> None:
    with pytest.raises(MissingGroundTruth, match="no reference answer.*ground_truth_column"):
        judge.judge(judge_input("72", gold={"question": "?"}))


def test_format_options() -> None:
    strict = MathJudge(MathJudgeOptions(use_math_verify=False, answer_format="boxed", require_format=True,
                                        format_reward=0.1))
    boxed = strict.judge(judge_input(r"\boxed{72}"))
    assert boxed.success is True and boxed.reward == pytest.approx(1.1)
    hashed = strict.judge(judge_input("#### 72"))  # right number, wrong form
    assert hashed.success is False and hashed.reward == 0.0
    assert hashed.details["format_ok"] == 0.0 and hashed.details["answer_format"] == "hash"


def test_strict_only_ignores_unmarked_numbers() -> None:
    strict = MathJudge(MathJudgeOptions(use_math_verify=False))
    result = strict.judge(judge_input("The answer is 72."))
    assert result.success is False
    assert result.details["method"] == "strict"


def test_a_pathological_answer_falls_back_to_the_strict_check() -> None:
    judge = MathJudge(MathJudgeOptions(verify_timeout=1.0, verify_workers=1))
    try:
        # math-verify would evaluate 9^(9^(9^9)); it is stopped and the marked answer compared strictly.
        result = judge.judge(judge_input(r"Maybe \boxed{9^{9^{9^{9}}}} ... no. #### 72"))
    finally:
        judge.verifier.close()
    assert result.details["method"] == "strict"
    assert "stopped after" in result.details["verify_note"]
    assert result.success is False  # the boxed answer is the one that counts, and it is not 72


def test_registered_under_both_names_with_validated_options() -> None:
    assert get_component("judges", "math") is MathJudge
    assert get_component("judges", "gsm8k") is GSM8KJudge
    assert issubclass(GSM8KJudge, MathJudge)
    options = component_options(MathJudge, JudgeConfig(type="math", answer_format="boxed"), "judge")
    assert options.answer_format == "boxed"
    from agenttune.plugin_api import UserError

    with pytest.raises(UserError, match="answer_format"):
        component_options(MathJudge, JudgeConfig(type="math", answer_format="latex"), "judge")


def write_gsm8k(root: Path) -> Path:
    """A local copy laid out like a download of openai/gsm8k (parquet per split)."""
    import datasets

    directory = root / "openai" / "gsm8k" / "main"
    directory.mkdir(parents=True)
    datasets.Dataset.from_list(GSM8K_ROWS).to_parquet(str(directory / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(GSM8K_ROWS[:2]).to_parquet(str(directory / "test-00000-of-00001.parquet"))
    return directory


def test_gsm8k_rows_need_no_column_settings_and_are_judged_right(tmp_path: Path, judge: MathJudge) -> None:
    directory = write_gsm8k(tmp_path)
    reader_cls = get_component("task_readers", "huggingface")
    section = TaskReaderConfig(type="huggingface", dataset_path=str(directory))
    reader = reader_cls(component_options(reader_cls, section, "task_reader"))
    tasks = list(reader.read("train"))
    assert [task.query for task in tasks] == [row["question"] for row in GSM8K_ROWS]
    assert [task.metadata["ground_truth"] for task in tasks] == ["72", "10", "2,000", "1.25"]
    answers = {  # what a model might write, right and wrong
        0: ("In May she sold 24, so 48 + 24 = 72.\n#### 72", True),
        1: (r"0.2 dollars a minute times 50 minutes: \boxed{\$10.00}", True),
        2: ("The shop sold 2,000 pens.", True),
        3: (r"\boxed{1.2}", False),
    }
    for index, task in enumerate(tasks):
        text, correct = answers[index]
        result = judge.judge(JudgeInput(task=task, output=WorkflowOutput(metadata={"final_answer": text})))
        assert result.success is correct, (task.task_id, result.details)
    assert len(list(reader.read("test"))) == 2


def test_format_compliance_becomes_a_step_metric(judge: MathJudge) -> None:
    from agenttune.plugin_api import Episode, step_metrics

    answers = [r"\boxed{72}", "#### 72", "72 clips", r"\boxed{70}"]
    episodes = []
    for index, answer in enumerate(answers):
        result = judge.judge(judge_input(answer))
        episodes.append(Episode(episode_id=str(index), task=Task(task_id="t", query="q"), group_id="g",
                                reward=result.reward, success=result.success, judge_details=result.details))
    metrics = step_metrics(episodes)
    assert metrics["judge/format_ok"] == pytest.approx(0.75)  # three of four answers came marked
    assert metrics["judge/correct"] == pytest.approx(0.75)   # 72, 72, 72 right; 70 wrong
    assert metrics["success_rate"] == pytest.approx(0.75)
