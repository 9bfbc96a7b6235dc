"""The seeds' AppWorld agent: an AgentScope ReAct agent that talks to an EnvService environment.

Written as an AgentScope 1.x user writes it. What agenttune changes: the model comes from
`tuner.as_agentscope_model()`, and the environment from `env_for(task, tuner)` — `reset()` creates
the AppWorld instance, `step()` is ASTune's `gym_step`, and the `env_service` judge evaluates the
instance after the episode, before it is released. Tool calls are off (the agent writes Python in
its replies; AppWorld executes it), as in ASTune's `agentscope_disable_toolcalls: True`.
"""

from __future__ import annotations

from agentscope.agent import ReActAgent
from agentscope.formatter import DashScopeChatFormatter
from agentscope.memory import InMemoryMemory
from agentscope.message import Msg
from agenttune_envservice import env_for

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.workflow.tuner import ModelTuner


class AppWorldAgentWorkflow(Workflow):
    name = "appworld_agentscope_workflow"

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        env = env_for(task, tuner)
        first_msg, *task_msgs = await env.reset()  # AppWorld: the instructions, then the task
        agent = ReActAgent(
            name="Qwen",
            sys_prompt=first_msg["content"],
            model=tuner.as_agentscope_model(),
            formatter=DashScopeChatFormatter(),
            memory=InMemoryMemory(),
            toolkit=None,
            print_hint_msg=False,
        )
        agent.set_console_output_enabled(False)
        opening = "\n\n".join(message["content"] for message in task_msgs) or task.query
        interaction_message = Msg(name="env", content=opening, role="user")
        steps = 0
        for _ in range(tuner.config.rollout.max_turns):
            # agentscope deals with the interaction message
            reply_message = await agent(interaction_message)
            # the EnvService protocol
            obs, _, terminate, _ = await env.step({"role": "assistant", "content": reply_message.get_text_content() or ""})
            steps += 1
            # the environment's answer is the next user message
            interaction_message = Msg(name="env", content=obs, role="user")
            if terminate or tuner.context_overflow:
                break
        return WorkflowOutput(metadata={"env_steps": steps, "terminated": env.terminated})
