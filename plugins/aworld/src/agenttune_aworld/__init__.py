"""agenttune-plugin-aworld: train AWorld agents with agenttune.

    from agenttune_aworld import AgentTrainer      # AWorld Train's entry point, on any agenttune backbone
    from agenttune_aworld import AgentWorkflow     # runs an AWorld Agent on each task (Runners.run)

This package is imported whenever agenttune lists its plugins, so it imports nothing heavy itself:
the names above (and AWorld) load on first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "AgentTrainer": "agenttune_aworld.trainer",
    "AgentWorkflow": "agenttune_aworld.workflow",
    "run_agent": "agenttune_aworld.workflow",
    "episode_agent": "agenttune_aworld.agents",
    "point_agent_at": "agenttune_aworld.agents",
    "RewardFunctionJudge": "agenttune_aworld.reward",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agenttune_aworld' has no attribute {name!r}")
