"""agenttune's AgentScope plugin: the model under training as an AgentScope chat model.

    model = tuner.as_agentscope_model()            # AgentScope 1.x or 2.x, whichever is installed
    model = tuner.as_agentscope_model(agent="critic", stream=False)

Also here: a Python execution tool with time and memory limits for agents under training
(`execute_python_code` for 1.x toolkits, `python_tool()` for 2.x), and `agentscope_line()`, the
installed major version, for code that supports both lines. Nothing in this package imports
AgentScope until a model or tool is built.
"""

from agenttune_agentscope.options import AgentScopeOptions
from agenttune_agentscope.python_sandbox import PythonLimits, PythonRun, run_python
from agenttune_agentscope.tools import execute_python_code, python_tool
from agenttune_agentscope.version import agentscope_line

__all__ = ["AgentScopeOptions", "PythonLimits", "PythonRun", "agentscope_line", "execute_python_code", "python_tool",
           "run_python"]
