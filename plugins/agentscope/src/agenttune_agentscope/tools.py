"""A Python execution tool for AgentScope agents, safe to hand a model under training.

AgentScope 1.x ships `agentscope.tool.execute_python_code`, with no memory limit, a 300 s default
timeout the model itself may raise, and stray child processes left running on timeout. This is a
drop-in replacement (same name, same result format) built on `python_sandbox`; 2.x has no such
tool, so `python_tool()` wraps the same runner as a `FunctionTool`.
"""

from __future__ import annotations

from typing import Any

from agenttune_agentscope.python_sandbox import PythonLimits, run_python


async def execute_python_code(code: str) -> Any:
    """Execute Python code and return its return code, standard output and standard error.

    Use `print` to see results. The code runs in a fresh process with a time and memory limit.

    Args:
        code (`str`):
            The Python code to execute.
    """
    from agentscope.message import TextBlock
    from agentscope.tool import ToolResponse

    run = await run_python(code)
    return ToolResponse(content=[TextBlock(type="text", text=run.as_text())])


def python_tool(limits: PythonLimits = PythonLimits(), name: str = "execute_python_code") -> Any:
    """The same tool for AgentScope 2.x: a `FunctionTool` that is allowed to run without asking."""
    from agentscope.permission import PermissionBehavior, PermissionDecision
    from agentscope.tool import FunctionTool

    async def run(code: str) -> str:
        return (await run_python(code, limits)).as_text()

    run.__doc__ = execute_python_code.__doc__  # AgentScope builds the tool's schema from it
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="Runs in agenttune's Python sandbox.")
    return FunctionTool(run, name=name, is_concurrency_safe=True, permission=allow)
