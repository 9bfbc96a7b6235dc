"""agenttune-plugin-envservice: environments served over the EnvService protocol (AppWorld and others).

    task_reader: {type: env_service, env_type: appworld}
    judge: {type: env_service}
    env_service: {command: ..., url: http://127.0.0.1:8080}     # optional: start the server with the run

In a workflow, `env = env_for(task, tuner)`, then `await env.reset()` and `await env.step(action)`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttune_envservice.client import (
        EnvServiceClient,
        EnvServiceError,
        EnvServiceProtocolError,
        EnvServiceUnavailable,
    )
    from agenttune_envservice.environment import Environment, EnvSpec, env_for

# Imported on first use: agenttune loads this package (for its plugin hooks) on every command,
# `agenttune --help` included, and the client pulls in httpx and agenttune's run machinery.
_EXPORTS = {
    "EnvServiceClient": "client", "EnvServiceError": "client", "EnvServiceProtocolError": "client",
    "EnvServiceUnavailable": "client", "EnvSpec": "environment", "Environment": "environment",
    "env_for": "environment",
}

__all__ = ["EnvServiceClient", "EnvServiceError", "EnvServiceProtocolError", "EnvServiceUnavailable", "EnvSpec",
           "Environment", "env_for"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
