"""Running an AWorld agent on a task: `run_agent`, and `AgentWorkflow`, a workflow that needs no code.

    workflow: agenttune_aworld:AgentWorkflow
    aworld:
      agent: my_agents:build_gaia_agent      # a function returning a new Agent, or an Agent

Each episode gets its own agent (see `agents.episode_agent`) pointed at the gateway, runs the task's
query through `Runners.run`, and hands the agent's answer to the judge as `final_answer`. Subclass
`AgentWorkflow` and override `build_agent` or `task_input` to build the agent or the input yourself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agenttune.plugin_api import UserError, Workflow, WorkflowOutput

if TYPE_CHECKING:
    from agenttune.plugin_api import ModelTuner, Task


class AgentRunError(RuntimeError):
    """AWorld reported that the task failed (the message is AWorld's)."""


async def run_agent(aworld_agent: Any, task_input: str, tuner: ModelTuner | None = None) -> str:
    """Run `aworld_agent` on `task_input` with `Runners.run`; return its answer as text.

    A failed AWorld task raises AgentRunError (the episode fails with AWorld's message), except when
    the conversation outgrew the model's context: that is an outcome to judge, and the answer so far
    (often empty) is returned. With a `tuner`, AWorld's retries of failed LLM calls are turned off
    (see agents.LLM_MAX_ATTEMPTS).
    """
    from aworld.runner import Runners

    from agenttune_aworld.agents import LLM_MAX_ATTEMPTS

    if tuner is not None and hasattr(aworld_agent, "llm_max_attempts"):
        aworld_agent.llm_max_attempts = LLM_MAX_ATTEMPTS
    response = await Runners.run(input=task_input, agent=aworld_agent)
    if response is None:
        raise AgentRunError("Runners.run returned no response")
    if not response.success:
        # After a context overflow or the turn limit too: the episode then ends with status
        # context_overflow / turn_limit (its samples kept, judged or given the configured reward), as
        # when AgentScope raises it.
        raise AgentRunError(f"the AWorld task failed{_limit_reached(tuner)}: {response.msg or response.status}")
    answer = response.answer
    return answer if isinstance(answer, str) else ("" if answer is None else str(answer))


def _limit_reached(tuner: Any) -> str:
    if tuner is not None and tuner.context_overflow:
        return " (the conversation outgrew model.max_model_len)"
    if tuner is not None and getattr(tuner, "turn_limit", False):
        return " (the agent used all rollout.max_turns model calls)"
    return ""


class AgentWorkflow(Workflow):
    """Runs the AWorld agent of the `aworld.agent` setting on each task; its answer goes to the judge."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        aworld_agent = self.build_agent(task, tuner)
        answer = await run_agent(aworld_agent, self.task_input(task), tuner)
        tuner.update_judge_input_dictionary(final_answer=answer)
        return WorkflowOutput(metadata={"final_answer": answer})

    def build_agent(self, task: Task, tuner: ModelTuner) -> Any:
        """This episode's agent: the configured one, made fresh and pointed at the gateway."""
        from agenttune_aworld.agents import episode_agent

        return episode_agent(configured_agent(tuner.config), tuner)

    def task_input(self, task: Task) -> str:
        """The text the agent is given: the task's query."""
        return task.query


def configured_agent(config: Any) -> Any:
    """The agent (or agent factory) that the `aworld.agent` reference names."""
    from agenttune.plugin_api import load_reference
    from agenttune_aworld.options import AWorldOptions

    reference = config.section("aworld", AWorldOptions).agent
    if not reference:
        raise UserError("aworld.agent is not set, so AgentWorkflow has no agent to run.",
                        hint="Set aworld.agent to 'my_module:build_agent' (a function returning an AWorld Agent), "
                             "or use agenttune_aworld.AgentTrainer(agent=...).")
    return load_reference(reference, key="aworld.agent", search_path=config.source_dir)
