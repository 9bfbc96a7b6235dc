"""agenttune: train the LLM agent you already have with reinforcement learning."""

from agenttune.components.judges.base import Judge, JudgeInput, JudgeResult
from agenttune.registry import compatibility
from agenttune.registry.hookspecs import hookimpl
from agenttune.workflow.base import Workflow, WorkflowOutput
from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
from agenttune.workflow.task import Task

__version__ = "0.2.0"

# Old module paths plugins imported (agenttune.task_reader, ...) keep working for one release line,
# with a DeprecationWarning naming the new import.
compatibility.install_shims()

# Imported on first use: `import agenttune` stays light.
_LAZY = {"Trainer": "agenttune.entrypoints.python_api", "ModelTuner": "agenttune.workflow.tuner", "WorkflowTask": "agenttune.workflow.task"}

__all__ = [
    "Episode",
    "EpisodeStatus",
    "Judge",
    "JudgeInput",
    "JudgeResult",
    "ModelTuner",
    "Sample",
    "Task",
    "Trainer",
    "Workflow",
    "WorkflowTask",
    "WorkflowOutput",
    "hookimpl",
    "__version__",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agenttune' has no attribute {name!r}")
