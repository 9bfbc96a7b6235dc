"""agenttune: train the LLM agent you already have with reinforcement learning."""

from agenttune.episode import Episode, EpisodeStatus, Sample
from agenttune.hookspecs import hookimpl
from agenttune.judge import Judge, JudgeInput, JudgeResult
from agenttune.task import Task
from agenttune.workflow import Workflow, WorkflowOutput

__version__ = "0.1.0"

__all__ = [
    "Episode",
    "EpisodeStatus",
    "Judge",
    "JudgeInput",
    "JudgeResult",
    "Sample",
    "Task",
    "Workflow",
    "WorkflowOutput",
    "hookimpl",
    "__version__",
]
