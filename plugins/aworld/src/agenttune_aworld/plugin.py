"""Registers the `aworld` agent framework, the `reward_function` judge and the `aworld:` config section.

Light on purpose: AWorld itself is imported only when an agent runs.
"""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_agent_frameworks():
    from agenttune_aworld.framework import AWorldFramework

    return [AWorldFramework]


@hookimpl
def register_judges():
    from agenttune_aworld.reward import RewardFunctionJudge

    return [RewardFunctionJudge]


@hookimpl
def register_config_sections():
    from agenttune_aworld.options import AWorldOptions

    return {"aworld": AWorldOptions}
