"""The `reward_function` judge (AWorld Train's reward signature) and the example's GAIA reward."""

from __future__ import annotations

import uuid

import pytest
from agenttune_aworld.reward import RewardFunctionJudge
from gaia_reward import answers_match, extract_answer, gaia_reward_func

from agenttune.plugin_api import (
    JudgeConfig,
    JudgeInput,
    Task,
    UserError,
    WorkflowOutput,
    component_options,
    get_component,
    keep,
)

CALLS: list[tuple] = []


def recording_reward(data_source, solution_str, ground_truth, extra_info):
    CALLS.append((data_source, solution_str, ground_truth, extra_info))
    return {"score": 0.5, "acc": False, "length": len(solution_str)}


async def async_reward(data_source, solution_str, ground_truth, extra_info):
    return 1.0 if solution_str == ground_truth else 0.0


def judge_for(function) -> RewardFunctionJudge:
    section = JudgeConfig(type="reward_function", function=function)
    cls = get_component("judges", "reward_function", key="judge.type")
    return cls(component_options(cls, section, "judge"))


def judge_input(answer=None, **task) -> JudgeInput:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "last words"}]
    return JudgeInput(task=Task(task_id="t7", query="q", **task), output=WorkflowOutput(),
                      handed={} if answer is None else {"final_answer": answer}, messages=messages)


def test_the_function_gets_verl_style_arguments_and_its_dict_is_kept():
    CALLS.clear()
    judge = judge_for("test_reward:recording_reward")
    result = judge.judge(judge_input("<answer>4</answer>", metadata={
        "data_source": "gaia", "ground_truth": "4", "extra_info": {"index": 3}}))
    [(data_source, solution, ground_truth, extra_info)] = CALLS
    assert (data_source, solution, ground_truth) == ("gaia", "<answer>4</answer>", "4")
    assert extra_info["index"] == 3 and extra_info["task_id"] == "t7" and extra_info["messages"][-1]["content"] == "last words"
    assert (result.reward, result.success, result.details) == (0.5, False, {"acc": False, "length": 18})


def test_without_a_final_answer_the_last_assistant_message_is_judged_and_verl_ground_truth_is_found():
    CALLS.clear()
    judge_for("test_reward:recording_reward").judge(judge_input(metadata={"reward_model": {"ground_truth": "9"}}))
    assert CALLS[0][:3] == ("", "last words", "9")


def test_async_functions_and_objects_kept_in_process():
    judge = judge_for(keep(async_reward))
    assert judge.judge(judge_input("x", metadata={"ground_truth": "x"})).reward == 1.0
    assert judge.judge(judge_input("y", metadata={"ground_truth": "x"})).success is False


def test_a_file_path_names_the_function_like_aworld_train(tmp_path):
    path = tmp_path / f"my_reward_{uuid.uuid4().hex[:6]}.py"
    path.write_text(f"def {path.stem}(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return float(solution_str == ground_truth)\n", encoding="utf-8")
    assert judge_for(str(path)).judge(judge_input("a", metadata={"ground_truth": "a"})).reward == 1.0
    other = tmp_path / "rewards.py"
    other.write_text("def exact(data_source, solution_str, ground_truth, extra_info=None):\n    return 2\n", encoding="utf-8")
    assert judge_for(f"{other}:exact").judge(judge_input("a")).reward == 2.0


def two_arguments(solution_str, ground_truth):
    return 1.0


def returns_text(data_source, solution_str, ground_truth, extra_info):
    return "1"


@pytest.mark.parametrize(("function", "message"), [
    ("test_reward:two_arguments", r"cannot be called as \(data_source, solution_str, ground_truth, extra_info\)"),
    ("test_reward:CALLS", r"is a list, not a function"),
    ("test_reward:missing", r"module 'test_reward' has no attribute 'missing'"),
    ("no/such/file.py:f", r"'no/such/file.py' does not exist"),
    ("not a reference", r"is not a code reference"),
])
def test_bad_functions_are_reported_when_the_config_is_checked(function, message):
    with pytest.raises(UserError, match=message):
        judge_for(function)


def test_a_bad_return_value_fails_the_episode_not_the_run():
    with pytest.raises(ValueError, match=r"returned '1'; return a finite number"):
        judge_for("test_reward:returns_text").judge(judge_input("a"))


@pytest.mark.parametrize(("solution", "truth", "reward"), [
    ("Thinking... <answer>3.55</answer>", "3.55", 1.0),
    ("<answer> $1,083 </answer>", "1083", 1.0),
    ("<answer>1083.0</answer>", "1083", 1.0),
    ("<answer>1082</answer>", "1083", 0.0),
    ("<answer>the pacific ocean.</answer>", "The Pacific Ocean", 1.0),
    ("<answer>Mercury; Venus; Earth</answer>", "Mercury, Venus, Earth", 1.0),
    ("<answer>Mercury, Earth, Venus</answer>", "Mercury, Venus, Earth", 0.0),
    ("<answer>1, 2</answer>", "1, 2, 3", 0.0),
    ("<answer>a</answer> then <answer>22</answer>", "22", 1.0),
    ("22", "22", 0.0),  # no <answer> tags: no answer
])
def test_gaia_reward(solution, truth, reward):
    assert gaia_reward_func("gaia_style", solution, truth, {}) == reward


def test_gaia_answer_extraction_and_matching():
    assert extract_answer("no tags") is None
    assert extract_answer("<ANSWER>\n x \n</ANSWER>") == "x"
    assert answers_match("42%", "42") and not answers_match("forty-two", "42")
