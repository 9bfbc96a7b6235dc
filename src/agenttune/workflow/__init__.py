"""What a user's workflow is given and gives back: the data that flows from task to episode.

    task.py      Task, WorkflowTask: what a workflow is given
    base.py      Workflow, WorkflowOutput: the user's side of the contract
    tuner.py     ModelTuner: the workflow's handle on the model; the Protocols it needs from its host
    episode.py   Episode, Sample, EpisodeStatus: what a finished episode is

`from agenttune.workflow import Workflow, WorkflowOutput` (the module this package replaced) still works.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"Workflow": "agenttune.workflow.base", "WorkflowOutput": "agenttune.workflow.base"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'agenttune.workflow' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
