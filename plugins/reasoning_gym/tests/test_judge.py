"""The `reasoning_gym` judge against the generators' own score_answer, and its limits in a real run."""

from __future__ import annotations

from pathlib import Path

import pytest
from agenttune_reasoning_gym.judge import NotAReasoningGymTask, ReasoningGymJudge
from agenttune_reasoning_gym.reader import ReasoningGymTaskReader
from conftest import EXAMPLE, rollout_records
from reasoning_gym.factory import create_dataset
from reasoning_gym.utils import extract_answer

from agenttune import Task
from agenttune.plugin_api import JudgeInput, WorkflowOutput, load_config, train_from_config


def first_task(dataset: str, **config) -> Task:
    options = ReasoningGymTaskReader.Options(dataset=dataset, config=config, splits={"train": 1})
    return next(iter(ReasoningGymTaskReader(options).read("train")))


def judged(task: Task, reply: str, **options):
    judge = ReasoningGymJudge(ReasoningGymJudge.Options(**options))
    return judge.judge(JudgeInput(task=task, output=WorkflowOutput(), handed={"final_answer": reply}))


def own_score(task: Task, reply: str) -> float:
    stored = task.metadata["reasoning_gym"]
    dataset = create_dataset(stored["dataset"], **stored["config"])
    return dataset.score_answer(extract_answer(reply), stored["entry"])


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "spell_backward"])
def test_the_judge_gives_what_score_answer_gives(dataset: str) -> None:
    task = first_task(dataset)
    right = task.ground_truth
    replies = {
        "right": f"Let me think. <answer>{right}</answer>",
        "right, spaced": f"<answer> {right} </answer>",
        "wrong": "<answer>zzz</answer>",
        "partly right": f"<answer>{right}{right}</answer>",
        "two answers, the last counts": f"<answer>zzz</answer> no: <answer>{right}</answer>",
        "no tag": f"The answer is {right}.",
        "unclosed tag": f"<answer>{right}",
        "empty": "",
    }
    scores = {}
    for name, reply in replies.items():
        result = judged(task, reply)
        assert result.reward == pytest.approx(own_score(task, reply)), name
        scores[name] = result.reward
    assert scores["right"] == scores["right, spaced"] == scores["two answers, the last counts"] == 1.0
    assert judged(task, replies["right"]).success and not judged(task, replies["wrong"]).success
    assert scores["wrong"] == scores["no tag"] == scores["unclosed tag"] == scores["empty"] == 0.0
    assert 0.0 < scores["partly right"] < 1.0  # both generators give partial credit here
    assert judged(task, replies["right"]).details["format_ok"] == 1.0
    assert judged(task, replies["no tag"]).details["format_ok"] == 0.0


def test_whole_reply_scores_an_untagged_reply_as_the_answer() -> None:
    task = first_task("basic_arithmetic")
    assert judged(task, f" {task.ground_truth}\n", untagged="whole_reply").reward == 1.0
    assert judged(task, f" {task.ground_truth}\n").reward == 0.0
    assert judged(task, "", untagged="whole_reply").reward == 0.0


def test_the_judge_reads_the_last_assistant_message_when_nothing_was_handed() -> None:
    task = first_task("basic_arithmetic")
    judge = ReasoningGymJudge()
    messages = [{"role": "user", "content": task.query},
                {"role": "assistant", "content": f"<answer>{task.ground_truth}</answer>"}]
    assert judge.judge(JudgeInput(task=task, output=WorkflowOutput(), messages=messages)).reward == 1.0


def test_a_task_of_another_reader_is_a_judge_error_that_says_so() -> None:
    task = Task(task_id="t1", query="2+2?", metadata={"ground_truth": "4"})
    with pytest.raises(NotAReasoningGymTask, match="task_reader.type: reasoning_gym"):
        judged(task, "<answer>4</answer>")


# -- the judge's limits apply to score_answer (a real debug run, the judge in its worker processes) ------------
SLEEPY_RUN = """\
workflow: rg_agent:ReasoningGymAgent
task_reader: {type: reasoning_gym, imports: [sleepy_generator], dataset: sleepy, config: CONFIG, splits: {train: 1}}
judge: {type: reasoning_gym, untagged: whole_reply}
model: {path: "tiny://default", max_model_len: 1024}
rollout: {num_repeat: 2, max_response_length_in_one_turn: 8}
debug: {first_n_tasks: 1}
"""


def debug_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, *overrides: str) -> list[dict]:
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the example's workflow module
    conf = tmp_path / "sleepy.yaml"
    conf.write_text(SLEEPY_RUN.replace("CONFIG", config))
    run = train_from_config(load_config(conf, list(overrides), backbone="debug"), run_dir=tmp_path / "run")
    return rollout_records(run.run_dir)


def test_a_score_answer_that_hangs_ends_its_episodes_judge_timeout(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    records = debug_run(tmp_path, monkeypatch, "{sleep_s: 60}", "judge.timeout=2", "judge.workers=2")
    assert len(records) == 2
    assert {record["status"] for record in records} == {"judge_timeout"}


def test_a_score_answer_that_eats_memory_ends_its_episodes_judge_memory(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # One worker, so that one allocation at a time is on this shared machine.
    records = debug_run(tmp_path, monkeypatch, "{allocate_mb: 1200}", "judge.memory_limit_mb=700",
                        "judge.timeout=60", "judge.workers=1")
    assert len(records) == 2
    assert {record["status"] for record in records} == {"judge_memory"}
