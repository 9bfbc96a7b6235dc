"""Workflows for the run tests: one that hangs after reset (cancellation), one that never resets."""

from __future__ import annotations

import asyncio

from agenttune_openenv import openenv_for

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.plugin_api import ModelTuner


class HangAfterReset(Workflow):
    """Opens its environment, then waits for ever: the episode timeout cancels it."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        await openenv_for(task, tuner).reset()
        await asyncio.sleep(3600)
        return WorkflowOutput()


class NoReset(Workflow):
    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        openenv_for(task, tuner)
        return WorkflowOutput()
