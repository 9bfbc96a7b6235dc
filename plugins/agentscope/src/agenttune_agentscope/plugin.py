"""Registers the `agentscope` agent framework and its `agentscope:` config section with agenttune.

Light on purpose: AgentScope itself is imported only when a model is built.
"""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_agent_frameworks():
    from agenttune_agentscope.framework import AgentScopeFramework

    return [AgentScopeFramework]


@hookimpl
def register_config_sections():
    from agenttune_agentscope.options import AgentScopeOptions

    return {"agentscope": AgentScopeOptions}
