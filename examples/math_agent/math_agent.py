"""The math agent for whichever AgentScope line is installed: the module both configs name.

`workflow: math_agent:MathAgentWorkflow` works unchanged with AgentScope 1.x (`math_agent_v1.py`,
the tutorial's ReActAgent) and 2.x (`math_agent_v2.py`, `Agent`): the two lines share no agent API,
so each has its own module, and this one imports the installed line's. No config names a line:
`pip install -e plugins/agentscope` alone brings 2.x, the `agentscope1` extra the tutorial's 1.x.
"""

from __future__ import annotations

from agenttune_agentscope import agentscope_line

# agentscope_line() is one paragraph (which versions to install) when AgentScope is missing or too new.
if agentscope_line() == 1:
    from math_agent_v1 import MathAgentWorkflow
else:
    from math_agent_v2 import MathAgentWorkflow

__all__ = ["MathAgentWorkflow"]
