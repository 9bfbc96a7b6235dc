"""A real AgentScope 1.x ReActAgent, with tools, against the gateway and the scripted engine."""

from __future__ import annotations

import pytest
from conftest import only_agentscope1, tool_call
from pydantic import BaseModel

from agenttune.testing.scripted_episode import assert_exact_sample

pytestmark = only_agentscope1

ANSWER = "2 + 3 = 5, so the answer is \\boxed{5}."


def make_toolkit(calls: list[tuple[int, int]]):
    from agentscope.message import TextBlock
    from agentscope.tool import Toolkit, ToolResponse

    def add(a: int, b: int) -> ToolResponse:
        """Add two integers.

        Args:
            a (`int`): The first number.
            b (`int`): The second number.
        """
        calls.append((a, b))
        return ToolResponse(content=[TextBlock(type="text", text=f"sum={a + b}")])

    toolkit = Toolkit()
    toolkit.register_tool_function(add)
    return toolkit


def make_agent(model, toolkit, formatter: str = "dashscope", name: str = "solver", max_iters: int = 3):
    from agentscope.agent import ReActAgent
    from agentscope.formatter import DashScopeChatFormatter, OpenAIChatFormatter
    from agentscope.memory import InMemoryMemory

    agent = ReActAgent(
        name=name,
        sys_prompt="You solve arithmetic with tools. Answer in \\boxed{}.",
        model=model,
        formatter=DashScopeChatFormatter() if formatter == "dashscope" else OpenAIChatFormatter(),
        toolkit=toolkit,
        memory=InMemoryMemory(),
        max_iters=max_iters,
    )
    agent.set_console_output_enabled(False)
    return agent


@pytest.mark.parametrize("formatter", ["dashscope", "openai"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
async def test_react_agent_tool_episode_merges_into_one_exact_sample(rig, stream, formatter):
    from agentscope.message import Msg

    # A bare tool call: DashScope's formatter sends that turn back as `content: []` plus the call.
    rig = await rig([tool_call("add", '{"a": 2, "b": 3}'), ANSWER])
    calls: list[tuple[int, int]] = []
    model = rig.tuner.as_agentscope_model(stream=stream)
    assert model.stream is stream
    agent = make_agent(model, make_toolkit(calls), formatter)

    reply = await agent.reply(Msg("user", "What is 2 + 3?", "user"))

    assert reply.get_text_content() == ANSWER
    assert calls == [(2, 3)]
    assert "<tool_response>\nsum=5\n</tool_response>" in rig.prompt_text(1)
    [sample] = rig.channel.samples()
    assert_exact_sample(rig, sample, calls=2)
    tool_result = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m == 0]
    assert "sum=5" in rig.tokenizer.decode(tool_result)  # the tool's output is context, never trained


class FinalAnswer(BaseModel):
    answer: str


async def test_react_agent_structured_output(rig):
    from agentscope.message import Msg

    rig = await rig(["Done.\n" + tool_call("generate_response", '{"answer": "5"}')])
    agent = make_agent(rig.tuner.as_agentscope_model(), make_toolkit([]))

    reply = await agent.reply(Msg("user", "What is 2 + 3?", "user"), structured_model=FinalAnswer)

    assert reply.metadata == {"answer": "5"}
    assert '"name": "generate_response"' in rig.prompt_text(0)  # offered as a tool
    [sample] = rig.channel.samples()
    assert_exact_sample(rig, sample, calls=1)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
async def test_model_structured_output_through_response_format(rig, stream):
    rig = await rig(['{"answer": "5"}'])
    model = rig.tuner.as_agentscope_model(stream=stream)
    messages = [{"role": "user", "content": "What is 2 + 3? Reply in JSON."}]

    response = await model(messages, structured_model=FinalAnswer)
    if stream:
        chunks = [chunk async for chunk in response]
        response = chunks[-1]

    assert response.metadata == {"answer": "5"}
    [sample] = rig.channel.samples()
    assert_exact_sample(rig, sample, calls=1)


async def test_seed_style_model_tuner_becomes_a_model_named_after_the_agent(rig):
    """The seeds write `ReActAgent(model=model_tuner, ...)`; that works and names the timeline."""
    from agentscope.message import Msg
    from agenttune_agentscope.v1 import TunedOpenAIChatModel

    rig = await rig([ANSWER])
    agent = make_agent(rig.tuner, make_toolkit([]), name="math_react_agent")

    assert isinstance(agent.model, TunedOpenAIChatModel)
    reply = await agent.reply(Msg("user", "What is 2 + 3?", "user"))

    assert reply.get_text_content() == ANSWER
    [sample] = rig.channel.samples()
    assert sample.agent == "math_react_agent"


async def test_two_agents_keep_separate_timelines_and_trainable_targets_pick_one(rig):
    from agentscope.message import Msg

    rig = await rig(["I will add.\n" + tool_call("add", '{"a": 2, "b": 3}'), ANSWER, "Looks right: 5."])
    solver = make_agent(rig.tuner.as_agentscope_model(agent="solver"), make_toolkit([]), name="solver")
    critic = make_agent(rig.tuner.as_agentscope_model(agent="critic"), make_toolkit([]), name="critic")

    answer = await solver.reply(Msg("user", "What is 2 + 3?", "user"))
    verdict = await critic.reply(Msg("user", f"Check this answer: {answer.get_text_content()}", "user"))

    assert verdict.get_text_content() == "Looks right: 5."
    samples = {sample.agent: sample for sample in rig.channel.samples()}
    assert set(samples) == {"solver", "critic"}
    assert samples["solver"].num_calls == 2 and samples["critic"].num_calls == 1
    assert "Check this answer" not in rig.tokenizer.decode(samples["solver"].prompt_ids + samples["solver"].response_ids)
    trained = rig.channel.samples(trainable_targets=["solver"])
    assert [sample.agent for sample in trained if sample.trainable] == ["solver"]
