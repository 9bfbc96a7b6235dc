"""MCP tool environments (tests/test_servers/tools_env.py): the session lists and calls tools, and
ToolEnvWorkflow gives them to the model as function tools and runs its tool calls as steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from agenttune_openenv.session import OpenEnvSession, OpenEnvSpec, StepResult
from agenttune_openenv.tool_workflow import function_tool, tool_result_text
from test_runs import config_for, records
from test_servers.tools_env import ADD_REWARD, question_for

from agenttune.plugin_api import UserError, train_from_config


def call(name: str, arguments: str) -> str:
    """A reply with one tool call, as the tiny model's template writes it (hermes, the gateway's default)."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


ADD = call("add", '{"a": 2, "b": 3}')
ANSWER = call("answer", '{"value": 5}')


def expected_rewards(seed: int) -> list[float]:
    """The scripted model adds 2 + 3 and answers 5: right only where the question is A + 3 with A = 2."""
    return [ADD_REWARD, 1.0 if sum(question_for(seed)) == 5 else 0.0]


async def test_a_session_lists_the_tools_and_calls_them_as_steps(tools_server):
    before = tools_server.stats()
    env = OpenEnvSession(OpenEnvSpec(url=tools_server.url, reset={"seed": 1}), "task-1")
    first = await env.reset()
    assert first.observation["prompt"].startswith("What is 2 + 3?")
    tools = {tool["name"]: tool for tool in await env.list_tools()}
    assert set(tools) == {"add", "answer"}
    assert tools["add"]["input_schema"]["required"] == ["a", "b"]
    assert env.steps == 0 and env.rewards == []  # listing is not a step
    added = await env.call_tool("add", {"a": 2, "b": 3})
    assert tool_result_text(added) == "5" and added.reward == pytest.approx(ADD_REWARD) and not added.done
    missing = await env.call_tool("subtract", {"a": 1})
    assert tool_result_text(missing).startswith("error (tool_not_found)")
    answered = await env.call_tool("answer", {"value": 5})
    assert tool_result_text(answered) == "right" and answered.done
    assert env.rewards == pytest.approx([ADD_REWARD, 0.0, 1.0]) and env.done
    await env.close()
    stats = tools_server.stats()
    assert stats.get("tool:add", 0) - before.get("tool:add", 0) == 1
    assert stats.get("tool:answer", 0) - before.get("tool:answer", 0) == 1


async def test_a_text_environment_has_no_tools_to_list(echo_server):
    env = OpenEnvSession(OpenEnvSpec(url=echo_server.url), "task-0")
    await env.reset()
    with pytest.raises(UserError, match="has no MCP tools to list.*CallToolAction"):
        await env.list_tools()
    await env.close()


def test_an_mcp_tool_becomes_a_function_tool():
    schema = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}
    assert function_tool({"name": "answer", "description": "Answer.", "input_schema": schema}) == {
        "type": "function", "function": {"name": "answer", "description": "Answer.", "parameters": schema}}
    assert function_tool({"name": "ping"})["function"]["parameters"] == {"type": "object", "properties": {}}


def test_tool_results_as_text():
    def observed(result: object = None, error: object = None) -> StepResult:
        return StepResult(observation={"tool_name": "t", "result": result, "error": error})

    assert tool_result_text(observed({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                                      "data": "ab", "is_error": False})) == "a\nb"
    assert tool_result_text(observed({"content": [], "data": {"x": 1}})) == '{"x": 1}'
    assert tool_result_text(observed({"content": [{"type": "text", "text": "boom"}], "is_error": True})) == \
        "error: boom"
    assert tool_result_text(observed(error={"error_type": "timeout", "message": "too slow"})) == \
        "error (timeout): too slow"


def test_a_run_makes_tool_calls_that_reach_the_server_and_rewards_come_back(tmp_path: Path, tools_server):
    before = tools_server.stats()
    # One episode at a time: the scripted replies (add, then answer) go to the episodes in turn.
    config = config_for(tmp_path, workflow="agenttune_openenv:ToolEnvWorkflow",
                        replace={"openenv": {"url": tools_server.url}},
                        engine={"replies": [ADD, ANSWER], "cycle": True},
                        task_reader={"train_size": 2}, debug={"first_n_tasks": 2, "max_parallel": 1})
    run = train_from_config(config, run_dir=tmp_path / "run")
    episodes = records(run.run_dir)
    assert len(episodes) == 4 and {episode["status"] for episode in episodes} == {"ok"}
    for episode in episodes:
        seed = episode["task"]["metadata"]["openenv"]["reset"]["seed"]  # the openenv reader's seed
        assert episode["judge_details"]["env_rewards"] == pytest.approx(expected_rewards(seed))
        assert episode["reward"] == pytest.approx(sum(expected_rewards(seed)))
        assert episode["judge_details"]["env_done"]
        calls = [call["function"]["name"] for message in episode["messages"] for call in message.get("tool_calls", [])]
        assert calls == ["add", "answer"]
        # The add call's result went back to the model; after answer the environment was done.
        assert [message["content"] for message in episode["messages"] if message["role"] == "tool"] == ["5"]
    assert {episode["success"] for episode in episodes} == {True, False}  # seed 1 asks 2 + 3; seed 0 does not
    stats = tools_server.stats()
    assert stats["tool:add"] - before.get("tool:add", 0) == 4
    assert stats["tool:answer"] - before.get("tool:answer", 0) == 4
    assert stats["live"] == 0
