"""A real AWorld agent calling real MCP tool servers (stdio, streamable HTTP, SSE) through the gateway:
the samples hold exactly the tokens the engine sampled, with the loss mask on them alone."""

from __future__ import annotations

import gaia_agent
import pytest
from agenttune_aworld.agents import episode_agent
from agenttune_aworld.workflow import AgentRunError, run_agent
from aworld.agents.llm_agent import Agent
from conftest import assert_exact_sample, stdio_mcp_config, tool_call

QUESTION = "How many Statues of Liberty tall is the Eiffel Tower?"


def build(tuner, mcp_config):
    conf = tuner.as_aworld_config()
    return Agent(name="gaia_agent", conf=conf, system_prompt=gaia_agent.SYSTEM_PROMPT, mcp_config=mcp_config,
                 mcp_servers=list(mcp_config["mcpServers"]))


async def test_stdio_tool_call_merges_into_one_exact_sample(rig):
    rig_ = await rig([tool_call("calculate", expression="330 / 93"), "<answer>3.55</answer>"])
    answer = await run_agent(build(rig_.tuner, stdio_mcp_config()), QUESTION, rig_.tuner)
    assert answer == "<answer>3.55</answer>"
    messages = rig_.channel.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3]["content"] == "3.54839"  # computed by the MCP server process
    assert "calculate" in rig_.tokenizer.decode(rig_.engine.prompts[0])  # AWorld offered the server's tools
    [sample] = rig_.channel.samples()
    assert_exact_sample(rig_, sample, calls=2)
    glue = rig_.tokenizer.decode([t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if not m])
    assert "<tool_response>\n3.54839\n</tool_response>" in glue


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_http_tool_servers(rig, mcp_http, transport):
    url = mcp_http(transport)
    rig_ = await rig([tool_call("search", query="eiffel tower height"), "<answer>330</answer>"])
    config = {"mcpServers": {"gaia-tools": {"type": transport, "url": url, "timeout": 30, "sse_read_timeout": 30}}}
    answer = await run_agent(build(rig_.tuner, config), "How tall is the Eiffel Tower?", rig_.tuner)
    assert answer == "<answer>330</answer>"
    assert rig_.channel.messages()[3]["content"] == "The Eiffel Tower is 330 metres tall (including antennas)."
    [sample] = rig_.channel.samples()
    assert_exact_sample(rig_, sample, calls=2)


async def test_the_example_agent_runs_per_episode_from_its_factory(rig):
    rig_ = await rig([tool_call("convert_units", value=8849, from_unit="m", to_unit="km"), "<answer>8.849</answer>"])
    agent = episode_agent(gaia_agent.build_agent, rig_.tuner)
    assert agent.conf.llm_config.llm_base_url == rig_.tuner.base_url
    assert await run_agent(agent, "How tall is Mount Everest in km?", rig_.tuner) == "<answer>8.849</answer>"
    assert rig_.channel.messages()[3]["content"] == "8.849"
    [sample] = rig_.channel.samples()
    assert_exact_sample(rig_, sample, calls=2)


async def test_a_template_agent_is_rebuilt_for_each_episode(rig):
    template = gaia_agent.build_agent()
    first = await rig(["<answer>a</answer>"])
    second = await rig(["<answer>b</answer>"])
    agents = [episode_agent(template, each.tuner) for each in (first, second)]
    assert agents[0] is not template and agents[0] is not agents[1]
    for each, agent in zip((first, second), agents, strict=True):
        assert agent.conf.llm_config.llm_api_key == each.tuner.api_key
        assert (agent.name(), agent.system_prompt, agent.mcp_servers) == (
            template.name(), template.system_prompt, template.mcp_servers)
    assert template.conf.llm_config.llm_base_url != first.tuner.base_url  # the template is left alone
    assert [await run_agent(a, "q", r.tuner) for a, r in zip(agents, (first, second), strict=True)] == [
        "<answer>a</answer>", "<answer>b</answer>"]
    assert first.channel.messages()[-1]["content"] == "<answer>a</answer>"
    assert second.channel.messages()[-1]["content"] == "<answer>b</answer>"


async def test_a_failing_llm_call_fails_the_run_without_retries(rig):
    rig_ = await rig([])  # the engine has no reply: the gateway answers 502
    with pytest.raises(AgentRunError, match="the AWorld task failed"):
        await run_agent(build(rig_.tuner, stdio_mcp_config()), QUESTION, rig_.tuner)
    assert len(rig_.engine.prompts) == 1  # AWorld's own retries (10 s, 20 s, ...) are off


async def test_an_overflowing_context_ends_the_run_as_an_overflow(rig):
    """AWorld swallows the gateway's 400; the adapter raises so that the rollout ends the episode with
    status context_overflow (the core's rule, tested in tests/test_rollout_engine.py), not as an answer."""
    rig_ = await rig(["never sent"], model={"max_model_len": 300})  # AWorld's first prompt is longer
    with pytest.raises(AgentRunError, match="outgrew model.max_model_len"):
        await run_agent(build(rig_.tuner, stdio_mcp_config()), QUESTION, rig_.tuner)
    assert rig_.tuner.context_overflow and rig_.engine.prompts == []
