"""The `llm_judge` judge against a real OpenAI-compatible server on loopback (uvicorn + starlette).

The server replays a script of answers per test: HTTP errors, replies without a score, slow replies,
and finally a graded reply, so retries, timeouts and the failure modes are exercised over real HTTP.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agenttune.components.judges.base import JudgeInput
from agenttune.components.judges.llm_judge import LLMJudge, LLMJudgeError, LLMJudgeOptions
from agenttune.config.models import JudgeConfig
from agenttune.errors import UserError
from agenttune.registry.config_loading import component_options
from agenttune.testing.judge_server import Reply, ScriptedChatServer
from agenttune.workflow.base import WorkflowOutput
from agenttune.workflow.task import Task


@dataclass
class JudgeServer(ScriptedChatServer):
    base_url: str = ""


@pytest.fixture
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer()
    with server.serving() as base_url:
        server.base_url = base_url
        yield server


def make_judge(server: JudgeServer, **options: Any) -> LLMJudge:
    defaults = {"base_url": server.base_url, "model": "grader", "api_key": "sk-test", "backoff": 0.01}
    return LLMJudge(LLMJudgeOptions(**{**defaults, **options}))


def judge_input(answer: str = "The answer is 72.") -> JudgeInput:
    task = Task(task_id="t1", query="How many clips did Natalia sell?", metadata={"answer": "48+24\n#### 72"})
    return JudgeInput(task=task, output=WorkflowOutput(metadata={"final_answer": answer}),
                      messages=[{"role": "user", "content": "How many?"}, {"role": "assistant", "content": answer}])


async def test_score_becomes_a_normalised_reward(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply("The arithmetic is right.\nScore: 8")]
    result = await make_judge(judge_server).judge(judge_input())
    assert result.reward == pytest.approx(0.8)
    assert result.success is True  # 0.8 >= default threshold 0.7
    assert result.details["llm_score"] == 8
    assert result.details["llm_attempts"] == 1
    sent = judge_server.requests[0]
    assert sent["model"] == "grader" and sent["temperature"] == 0.0
    prompt = sent["messages"][1]["content"]
    assert "How many clips did Natalia sell?" in prompt
    assert "The answer is 72." in prompt
    assert "#### 72" in prompt  # the reference answer from task metadata
    assert judge_server.headers[0]["authorization"] == "Bearer sk-test"


async def test_low_score_is_not_a_success(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply("Wrong total. Score: 2")]
    result = await make_judge(judge_server).judge(judge_input("70"))
    assert result.reward == pytest.approx(0.2)
    assert result.success is False


async def test_server_errors_and_missing_scores_are_retried(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply(status=503), Reply("I think it is fine."), Reply("Score: 10")]
    result = await make_judge(judge_server, max_retries=3).judge(judge_input())
    assert result.reward == 1.0
    assert result.details["llm_attempts"] == 3
    assert len(judge_server.requests) == 3


@pytest.mark.slow
async def test_a_slow_reply_times_out_and_is_retried(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply("Score: 9", delay=1.5), Reply("Score: 5")]
    result = await make_judge(judge_server, request_timeout=0.3).judge(judge_input())
    assert result.details["llm_score"] == 5
    assert result.details["llm_attempts"] == 2


async def test_failure_excludes_the_episode_by_default(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply(status=500), Reply(status=502), Reply("no idea")]
    with pytest.raises(LLMJudgeError, match=r"after 3 attempts.*HTTP 500.*HTTP 502.*no score"):
        await make_judge(judge_server, max_retries=2).judge(judge_input())
    assert len(judge_server.requests) == 3


async def test_failure_can_give_a_reward_instead(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply("Score: banana"), Reply("Score: 42")]  # 42 is out of the 0..10 range
    judge = make_judge(judge_server, max_retries=1, on_failure="reward", failure_reward=-0.5)
    result = await judge.judge(judge_input())
    assert result.reward == -0.5
    assert result.success is False
    assert result.details["judge_failed"] is True
    assert "no score" in result.details["judge_error"]


async def test_a_client_error_is_not_retried(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply(status=401), Reply("Score: 10")]
    with pytest.raises(LLMJudgeError, match="refused the request.*HTTP 401"):
        await make_judge(judge_server).judge(judge_input())
    assert len(judge_server.requests) == 1


async def test_an_unreachable_server_fails_cleanly() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on this port now
    judge = LLMJudge(LLMJudgeOptions(base_url=f"http://127.0.0.1:{port}/v1", model="m", backoff=0.01,
                                     on_failure="reward"))
    result = await judge.judge(judge_input())
    assert result.details["judge_failed"] is True
    assert "ConnectError" in result.details["judge_error"]


async def test_custom_template_and_score_range(judge_server: JudgeServer) -> None:
    judge_server.script = [Reply("<grade>4</grade>")]
    judge = make_judge(
        judge_server,
        template="Q: {{ query }}\nA: {{ answer }}\nConversation:\n{{ transcript }}\nGrade 1-5 as <grade>N</grade>.",
        score_pattern=r"<grade>(\d)</grade>", min_score=1, max_score=5, success_threshold=0.75,
    )
    result = await judge.judge(judge_input())
    assert result.reward == pytest.approx(0.75)
    assert result.success is True
    prompt = judge_server.requests[0]["messages"][1]["content"]
    assert "assistant: The answer is 72." in prompt


async def test_endpoint_and_key_come_from_the_environment(judge_server: JudgeServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTTUNE_JUDGE_BASE_URL", judge_server.base_url)
    monkeypatch.setenv("AGENTTUNE_JUDGE_MODEL", "env-model")
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-from-env")
    judge_server.script = [Reply("Score: 7")]
    options = component_options(LLMJudge, JudgeConfig(type="llm_judge", api_key_env="MY_JUDGE_KEY"), "judge")
    result = await LLMJudge(options).judge(judge_input())
    assert result.reward == pytest.approx(0.7)
    assert judge_server.requests[0]["model"] == "env-model"
    assert judge_server.headers[0]["authorization"] == "Bearer sk-from-env"


def test_missing_endpoint_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGENTTUNE_JUDGE_BASE_URL", "OPENAI_BASE_URL", "AGENTTUNE_JUDGE_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match="needs base_url and model"):
        LLMJudge(LLMJudgeOptions())


def test_bad_options_are_user_errors() -> None:
    with pytest.raises(UserError, match="unknown_variable"):
        component_options(LLMJudge, JudgeConfig(type="llm_judge", template="{{ unknown_variable }}"), "judge")
    with pytest.raises(UserError, match="capturing group"):
        component_options(LLMJudge, JudgeConfig(type="llm_judge", score_pattern=r"score: \d+"), "judge")
    with pytest.raises(UserError, match="max_score"):
        component_options(LLMJudge, JudgeConfig(type="llm_judge", min_score=5, max_score=5), "judge")
