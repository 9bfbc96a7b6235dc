"""agenttune-plugin-openenv: OpenEnv environments as the episode's environment and reward source.

    workflow: agenttune_openenv:TextEnvWorkflow       # or ToolEnvWorkflow (MCP tools), or your own: openenv_for
    task_reader: {type: openenv, train_size: 64, validation_size: 16}
    judge: {type: openenv}
    openenv: {app: my_env.server.app:app}              # or command: ..., or url: ...

In a workflow, `env = openenv_for(task, tuner)`, then `await env.reset()` and `await env.step(action)`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttune_openenv.session import OpenEnvSession, OpenEnvSpec, StepResult, openenv_for
    from agenttune_openenv.tool_workflow import ToolEnvWorkflow
    from agenttune_openenv.workflow import TextEnvWorkflow

# Imported on first use: agenttune loads this package (for its plugin hooks) on every command,
# `agenttune --help` included, and the session pulls in openenv and agenttune's run machinery.
_EXPORTS = {
    "OpenEnvSession": "session", "OpenEnvSpec": "session", "StepResult": "session", "openenv_for": "session",
    "TextEnvWorkflow": "workflow", "ToolEnvWorkflow": "tool_workflow",
}

__all__ = ["OpenEnvSession", "OpenEnvSpec", "StepResult", "TextEnvWorkflow", "ToolEnvWorkflow", "openenv_for"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
