"""The math agent on AgentScope 2.x: `Agent` with a Python tool, answering in \\boxed{}.

2.x has no ReActAgent and no `execute_python_code`; `python_tool()` is agenttune's sandboxed Python
tool as a `FunctionTool`. The agent gets agenttune's headless defaults (no permission prompts, no
wall-clock time in the prompt) because its model comes from the tuner; see the plugin's README.
"""

from __future__ import annotations

from agentscope.agent import Agent, ReActConfig
from agentscope.message import UserMsg
from agentscope.tool import Toolkit
from agenttune_agentscope.tools import python_tool
from math_task import SYSTEM_PROMPT, answer_output

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.workflow.tuner import ModelTuner


class MathAgentWorkflow(Workflow):
    name = "math_agent_workflow_v2"

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        agent = Agent(
            name="math_agent",
            system_prompt=SYSTEM_PROMPT,
            model=tuner.as_agentscope_model(),
            toolkit=Toolkit(tools=[python_tool()]),
            react_config=ReActConfig(max_iters=2),
        )
        result = await agent.reply(UserMsg(name="user", content=task.query))
        return answer_output(result)
