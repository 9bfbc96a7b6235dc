"""A failing or never-ending AgentScope agent costs its own episode, never the batch."""

from __future__ import annotations

import asyncio

from conftest import LINE, make_config, tool_call

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.plugin_api import EpisodeStatus, Generation, RolloutEngine, ScriptedEngine


async def wait(seconds: float) -> str:
    """Wait a moment.

    Args:
        seconds (`float`): How long to wait.
    """
    await asyncio.sleep(seconds)
    return "waited"


async def run_agent(tuner, question: str, max_iters: int) -> str:
    """A real agent of the installed AgentScope line with one tool, run on `question`."""
    model = tuner.as_agentscope_model()
    if LINE == 1:
        from agentscope.agent import ReActAgent
        from agentscope.formatter import OpenAIChatFormatter
        from agentscope.message import Msg, TextBlock
        from agentscope.tool import Toolkit, ToolResponse

        async def wait_tool(seconds: float) -> ToolResponse:
            """Wait a moment.

            Args:
                seconds (`float`): How long to wait.
            """
            return ToolResponse(content=[TextBlock(type="text", text=await wait(seconds))])

        toolkit = Toolkit()
        toolkit.register_tool_function(wait_tool)
        agent = ReActAgent(name="agent", sys_prompt="Use tools.", model=model, formatter=OpenAIChatFormatter(),
                           toolkit=toolkit, max_iters=max_iters)
        agent.set_console_output_enabled(False)
        reply = await agent.reply(Msg("user", question, "user"))
    else:
        from agentscope.agent import Agent, ReActConfig
        from agentscope.message import UserMsg
        from agentscope.tool import FunctionTool, Toolkit

        agent = Agent(name="agent", system_prompt="Use tools.", model=model,
                      toolkit=Toolkit(tools=[FunctionTool(wait, name="wait_tool")]),
                      react_config=ReActConfig(max_iters=max_iters))
        reply = await agent.reply(UserMsg(name="user", content=question))
    return reply.get_text_content() or ""


class BehavingWorkflow(Workflow):
    """Does what the task says: answer, raise after the agent ran, or let the agent loop forever."""

    async def execute(self, task: Task, tuner) -> WorkflowOutput:
        behaviour = task.metadata["behaviour"]
        answer = await run_agent(tuner, task.query, max_iters=10**6 if behaviour == "loop" else 3)
        if behaviour == "raise":
            raise ValueError(f"could not parse an answer from {answer!r}")
        return WorkflowOutput(reward=1.0, metadata={"final_answer": answer})


async def test_raising_and_looping_agents_are_isolated(tiny_tokenizer):
    from agenttune.plugin_api import Gateway

    # (max_turns: the looping agent must run into the timeout, not the gateway's turn limit)
    config = make_config(rollout={"episode_timeout": 3.0, "num_repeat": 1, "max_env_worker": 4, "max_turns": 100_000})
    looping_call = tiny_tokenizer.encode(tool_call("wait_tool", '{"seconds": 0.1}'), add_special_tokens=False)

    def respond(prompt_ids, sampling):
        text = tiny_tokenizer.decode(prompt_ids)
        if "loop forever" in text:
            ids = looping_call + [tiny_tokenizer.eos_token_id]
        else:
            ids = tiny_tokenizer.encode("The answer is 5.", add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
        return Generation(ids, [-0.1] * len(ids), "stop")

    gateway = Gateway(ScriptedEngine(tokenizer=tiny_tokenizer, responder=respond), tiny_tokenizer, config)
    await gateway.start()
    try:
        tasks = [Task(task_id=behaviour, query=f"Please {behaviour}: what is 2 + 3?", metadata={"behaviour": behaviour})
                 for behaviour in ("answer", "raise", "loop forever", "answer")]
        tasks[2].metadata["behaviour"] = "loop"
        episodes = await RolloutEngine(config, gateway, BehavingWorkflow).run_tasks(tasks)
    finally:
        await gateway.stop()

    statuses = [episode.status for episode in episodes]
    assert statuses == [EpisodeStatus.OK, EpisodeStatus.WORKFLOW_ERROR, EpisodeStatus.TIMEOUT, EpisodeStatus.OK]
    assert "could not parse an answer" in episodes[1].error
    assert episodes[1].samples, "the failed episode's calls are still recorded"
    assert episodes[2].samples and episodes[2].samples[0].num_calls > 3  # it really looped
    assert [episode.reward for episode in (episodes[0], episodes[3])] == [1.0, 1.0]
