"""What the math agent is asked, on either AgentScope line: its system prompt, and the answer it gives.

`math_agent_v1.py` (AgentScope 1.x) and `math_agent_v2.py` (2.x) build different agents around the
same task; the `math` judge reads the `\\boxed{}` answer from `final_answer`.
"""

from __future__ import annotations

from typing import Any

from agenttune import WorkflowOutput

SYSTEM_PROMPT = """\
You are an agent specialized in solving math problems with tools.
Please solve the math problem given to you.
You can write and execute Python code to perform calculation or verify your answer.
You should return your final answer within \\boxed{}.
"""


def answer_output(reply: Any) -> WorkflowOutput:
    """The agent's reply message as the workflow's output: its text is the final answer."""
    return WorkflowOutput(reward=None, metadata={"final_answer": reply.get_text_content() or ""})
