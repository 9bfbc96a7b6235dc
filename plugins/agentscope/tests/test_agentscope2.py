"""A real AgentScope 2.x Agent, with tools, against the gateway and the scripted engine."""

from __future__ import annotations

import pytest
from conftest import only_agentscope2, tool_call
from pydantic import BaseModel

from agenttune.testing.scripted_episode import assert_exact_sample

pytestmark = only_agentscope2

ANSWER = "2 + 3 = 5, so the answer is \\boxed{5}."


def add_tool(calls: list[tuple[int, int]], **tool_options):
    from agentscope.tool import FunctionTool

    def add(a: int, b: int) -> str:
        """Add two integers.

        Args:
            a (`int`): The first number.
            b (`int`): The second number.
        """
        calls.append((a, b))
        return f"sum={a + b}"

    # No permission given: AgentScope's default for a custom tool is to ask a human first.
    return FunctionTool(add, **tool_options)


def make_agent(model, tools=(), name: str = "solver", **agent_options):
    from agentscope.agent import Agent, ReActConfig
    from agentscope.tool import Toolkit

    agent_options.setdefault("react_config", ReActConfig(max_iters=3))
    return Agent(name=name, system_prompt="You solve arithmetic with tools. Answer in \\boxed{}.",
                 model=model, toolkit=Toolkit(tools=list(tools)), **agent_options)


def user(text: str):
    from agentscope.message import UserMsg

    return UserMsg(name="user", content=text)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
async def test_agent_tool_episode_merges_into_one_exact_sample(rig, stream):
    rig = await rig(["I will add them.\n" + tool_call("add", '{"a": 2, "b": 3}'), ANSWER])
    calls: list[tuple[int, int]] = []
    model = rig.tuner.as_agentscope_model(stream=stream)
    assert model.stream is stream
    agent = make_agent(model, [add_tool(calls)])

    reply = await agent.reply(user("What is 2 + 3?"))

    assert reply.get_text_content() == ANSWER
    assert calls == [(2, 3)]  # ran without a human confirming: the headless permission mode
    assert "sum=5" in rig.prompt_text(1)
    [sample] = rig.channel.samples()
    assert_exact_sample(rig, sample, calls=2)
    tool_result = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m == 0]
    assert "sum=5" in rig.tokenizer.decode(tool_result)


async def test_headless_defaults_no_runtime_state_and_context_size_from_config(rig):
    rig = await rig([ANSWER], model={"max_model_len": 3000})
    model = rig.tuner.as_agentscope_model()
    agent = make_agent(model)

    await agent.reply(user("What is 2 + 3?"))

    assert model.context_size == 3000 - 256 - 64  # room for the reply: compression comes before a refusal
    assert agent.injection_config.inject_runtime_state is False
    assert "system-reminder" not in rig.prompt_text(0)


async def test_headless_defaults_yield_to_what_the_workflow_passes(rig):
    from agentscope.agent import InjectionConfig
    from agentscope.permission import PermissionMode

    rig = await rig([ANSWER])
    model = rig.tuner.as_agentscope_model(context_size=1234)
    agent = make_agent(model, injection_config=InjectionConfig(inject_runtime_state=True))

    await agent.reply(user("What is 2 + 3?"))

    assert model.context_size == 1234
    assert agent.state.permission_context.mode is PermissionMode.BYPASS
    assert "system-reminder" in rig.prompt_text(0)  # AgentScope's injection, as asked for


async def test_headless_off_in_config_keeps_agentscope_defaults(rig):
    from agentscope.permission import PermissionMode

    rig = await rig([tool_call("add", '{"a": 2, "b": 3}'), ANSWER], agentscope={"headless": False})
    calls: list[tuple[int, int]] = []
    agent = make_agent(rig.tuner.as_agentscope_model(), [add_tool(calls)])

    await agent.reply(user("What is 2 + 3?"))

    assert agent.state.permission_context.mode is PermissionMode.DEFAULT
    assert calls == []  # AgentScope parked the call, waiting for a human to confirm it


class FinalAnswer(BaseModel):
    answer: str


async def test_agent_structured_output(rig):
    rig = await rig(["Done.\n" + tool_call("GenerateStructuredOutput", '{"answer": "5"}'), "The answer is 5."],
                    cycle=True)
    agent = make_agent(rig.tuner.as_agentscope_model())

    reply = await agent.reply(user("What is 2 + 3?"), structured_schema=FinalAnswer)

    assert reply.structured_output == {"answer": "5"}
    [sample] = rig.channel.samples()
    assert_exact_sample(rig, sample, calls=len(rig.generated))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
async def test_model_structured_output(rig, stream):
    rig = await rig([tool_call("generate_structured_output", '{"answer": "5"}')])
    model = rig.tuner.as_agentscope_model(stream=stream)

    response = await model.generate_structured_output([user("What is 2 + 3?")], FinalAnswer)

    assert response.content == {"answer": "5"}
    [sample] = rig.channel.samples()
    assert_exact_sample(rig, sample, calls=1)


async def test_seed_style_model_tuner_becomes_a_model_named_after_the_agent(rig):
    from agenttune_agentscope.v2 import TunedOpenAIChatModel

    rig = await rig([ANSWER])
    agent = make_agent(rig.tuner, name="math_agent")

    assert isinstance(agent.model, TunedOpenAIChatModel)
    reply = await agent.reply(user("What is 2 + 3?"))

    assert reply.get_text_content() == ANSWER
    [sample] = rig.channel.samples()
    assert sample.agent == "math_agent"


async def test_two_agents_keep_separate_timelines_and_trainable_targets_pick_one(rig):
    rig = await rig(["I will add.\n" + tool_call("add", '{"a": 2, "b": 3}'), ANSWER, "Looks right: 5."])
    solver = make_agent(rig.tuner.as_agentscope_model(agent="solver"), [add_tool([])], name="solver")
    critic = make_agent(rig.tuner.as_agentscope_model(agent="critic"), name="critic")

    answer = await solver.reply(user("What is 2 + 3?"))
    verdict = await critic.reply(user(f"Check this answer: {answer.get_text_content()}"))

    assert verdict.get_text_content() == "Looks right: 5."
    samples = {sample.agent: sample for sample in rig.channel.samples()}
    assert set(samples) == {"solver", "critic"}
    assert samples["solver"].num_calls == 2 and samples["critic"].num_calls == 1
    trained = rig.channel.samples(trainable_targets=["solver"])
    assert [sample.agent for sample in trained if sample.trainable] == ["solver"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
async def test_agentscope2s_own_model_against_agenttune_serve(tmp_path, stream):
    """Issue 23: AgentScope 2.x's unmodified OpenAIChatModel (streaming by default), pointed at
    `agenttune serve`, runs a tool-using agent; the served conversation is recorded as one exact sample."""
    import asyncio

    from agentscope.agent import InjectionConfig
    from agentscope.credential import OpenAICredential
    from agentscope.model import OpenAIChatModel
    from agentscope.permission import PermissionContext, PermissionMode
    from agentscope.state import AgentState
    from conftest import make_config

    from agenttune.plugin_api import read_records, serve

    config = make_config(engine={"type": "scripted", "cycle": True, "replies": [
        "I will add them.\n" + tool_call("add", '{"a": 2, "b": 3}'), ANSWER]}, gateway={"port": 0})
    ready, stop = asyncio.get_running_loop().create_future(), asyncio.Event()
    server = asyncio.create_task(serve(config, tmp_path, ready=ready.set_result, stop=stop))
    base_url = await asyncio.wait_for(ready, 60)
    model = OpenAIChatModel(credential=OpenAICredential(api_key="as2-agent", base_url=base_url),
                            model="tiny", stream=stream)
    assert model.stream is stream
    calls: list[tuple[int, int]] = []
    # A model agenttune did not make gets no headless defaults: the agent says so itself.
    headless = AgentState(permission_context=PermissionContext(mode=PermissionMode("bypass")))
    agent = make_agent(model, [add_tool(calls)], injection_config=InjectionConfig(inject_runtime_state=False),
                       state=headless)

    reply = await agent.reply(user("What is 2 + 3?"))

    stop.set()
    await server
    assert reply.get_text_content() == ANSWER and calls == [(2, 3)]
    [record] = read_records(next((tmp_path / "rollouts").glob("step_*_serve.jsonl")))
    assert record.episode_id == "as2-agent" and record.metrics["calls"] == 2
    [sample] = record.samples
    assert sample.num_calls == 2 and "sum=5" in "".join(
        text for text, mask in zip(sample.response_tokens, sample.loss_mask, strict=True) if not mask)
