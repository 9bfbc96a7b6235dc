"""`math_and_llm`: the math check plus an LLM's grade of the reasoning, against a loopback judge server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agenttune_gsm8k.judges import MathAndLLMJudge

from agenttune.plugin_api import (
    JudgeConfig,
    JudgeInput,
    LLMJudgeError,
    Task,
    UserError,
    WorkflowOutput,
    component_options,
)
from agenttune.testing.judge_server import Reply, ScriptedChatServer


@pytest.fixture
def server() -> Iterator[tuple[ScriptedChatServer, str]]:
    chat = ScriptedChatServer()
    with chat.serving() as base_url:
        yield chat, base_url


def make_judge(base_url: str, **options) -> MathAndLLMJudge:
    llm = {"base_url": base_url, "model": "grader", "backoff": 0.01, **options.pop("llm", {})}
    section = JudgeConfig(type="math_and_llm", llm=llm, **options)
    return MathAndLLMJudge(component_options(MathAndLLMJudge, section, "judge"))


def episode(answer: str) -> JudgeInput:
    task = Task(task_id="t", query="48 clips in April, half as many in May. How many in all?",
                metadata={"answer": "48/2 = 24\n48 + 24 = 72\n#### 72"})
    return JudgeInput(task=task, output=WorkflowOutput(metadata={"final_answer": answer}),
                      messages=[{"role": "user", "content": task.query}, {"role": "assistant", "content": answer}])


async def test_rewards_are_weighted(server: tuple[ScriptedChatServer, str]) -> None:
    chat, base_url = server
    chat.script = [Reply("Sound reasoning. Score: 6")]
    judge = make_judge(base_url, math_weight=0.7, llm_weight=0.3)
    try:
        result = await judge.judge(episode("May: 48/2 = 24. Total 48 + 24 = 72.\n#### 72"))
    finally:
        await judge.aclose()
    assert result.success is True
    assert result.reward == pytest.approx(0.7 * 1.0 + 0.3 * 0.6)
    assert result.details["math_reward"] == 1.0 and result.details["llm_reward"] == pytest.approx(0.6)
    prompt = chat.requests[0]["messages"][1]["content"]
    assert "the final answer is right" in prompt  # the grader is told the program's verdict
    assert "assistant: May: 48/2 = 24." in prompt  # and sees the reasoning


async def test_a_wrong_answer_with_nice_reasoning_is_not_a_success(server: tuple[ScriptedChatServer, str]) -> None:
    chat, base_url = server
    chat.script = [Reply("Score: 10")]
    judge = make_judge(base_url)
    result = await judge.judge(episode(r"\boxed{70}"))
    await judge.aclose()
    assert result.success is False
    assert result.reward == pytest.approx(0.5 * 0.0 + 0.5 * 1.0)
    assert "the final answer is wrong" in chat.requests[0]["messages"][1]["content"]


async def test_judge_model_failure_follows_on_failure(server: tuple[ScriptedChatServer, str]) -> None:
    chat, base_url = server
    chat.script = [Reply(status=503)] * 2
    excluding = make_judge(base_url, llm={"max_retries": 1})
    with pytest.raises(LLMJudgeError, match="after 2 attempts"):
        await excluding.judge(episode("#### 72"))
    await excluding.aclose()

    chat.script = [Reply(status=503)] * 2
    rewarding = make_judge(base_url, llm={"max_retries": 1, "on_failure": "reward", "failure_reward": 0.0})
    result = await rewarding.judge(episode("#### 72"))
    await rewarding.aclose()
    assert result.success is True and result.reward == pytest.approx(0.5)
    assert result.details["judge_failed"] is True


def test_bad_llm_options_are_user_errors() -> None:
    with pytest.raises(UserError, match=r"llm\.temprature"):
        component_options(MathAndLLMJudge, JudgeConfig(type="math_and_llm", llm={"temprature": 0}), "judge")
