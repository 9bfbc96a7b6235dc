"""agenttune-plugin-verifiers: train on a verifiers environment (Environments Hub) named by its id.

    workflow: agenttune_verifiers:VerifiersWorkflow
    task_reader: {type: verifiers, id: my-env, args: {...}}
    judge: {type: verifiers}

The reader reads the environment's tasks, the workflow runs its own rollout against the gateway, the
judge runs its reward functions (docs/verifiers.md).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttune_verifiers.workflow import VerifiersRolloutError, VerifiersWorkflow

# Imported on first use: agenttune loads this package (for its plugin hooks) on every command, and
# verifiers takes seconds to import.
_EXPORTS = {"VerifiersWorkflow": "workflow", "VerifiersRolloutError": "workflow"}

__all__ = ["VerifiersRolloutError", "VerifiersWorkflow"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
