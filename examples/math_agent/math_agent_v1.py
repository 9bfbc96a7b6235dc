"""The seeds' math agent on AgentScope 1.x: a ReAct agent that may run Python, answering in \\boxed{}.

`math_agent.py` picks this module when AgentScope 1.x is installed; the configs name that one.

Written exactly as an AgentScope user would, except for two lines: the model comes from
`tuner.as_agentscope_model()`, and the Python tool is agenttune's sandboxed drop-in for
`agentscope.tool.execute_python_code` (time and memory limits, so model-written code cannot hang or
kill a rollout). The 2.x agent is `math_agent_v2.py`.
"""

from __future__ import annotations

from agentscope.agent import ReActAgent
from agentscope.formatter import DashScopeChatFormatter
from agentscope.memory import InMemoryMemory
from agentscope.message import Msg
from agentscope.tool import Toolkit
from agenttune_agentscope.tools import execute_python_code
from math_task import SYSTEM_PROMPT, answer_output

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.workflow.tuner import ModelTuner


class MathAgentWorkflow(Workflow):
    name = "math_agent_workflow"

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        toolkit = Toolkit()
        toolkit.register_tool_function(execute_python_code)
        agent = ReActAgent(
            name="math_react_agent",
            sys_prompt=SYSTEM_PROMPT,
            model=tuner.as_agentscope_model(),
            formatter=DashScopeChatFormatter(),
            toolkit=toolkit,
            memory=InMemoryMemory(),
            max_iters=2,
        )
        agent.set_console_output_enabled(False)
        result = await agent.reply(Msg("user", task.query, role="user"))
        return answer_output(result)
