"""The user's side of the contract: a `Workflow` runs the agent on one task."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from agenttune.workflow.task import Task
    from agenttune.workflow.tuner import ModelTuner


class WorkflowOutput(BaseModel):
    """What a workflow returns.

    Leave `reward` as None to let the configured judge score the episode; set it to score the
    episode yourself (the judge is then skipped unless it is told to run anyway).
    """

    reward: float | None = Field(default=None, description="The episode's reward, or None to ask the judge.")
    success: bool | None = Field(default=None, description="Whether the task was solved, if known.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free data, e.g. final_answer.")


class Workflow:
    """Runs an agent on one task with the model under training.

    Subclass it and implement `execute`, async (preferred) or plain (run in a worker thread).
    Build the agent inside `execute` with the model handle from `tuner` (for example
    `tuner.as_openai_client()`, `tuner.as_model(framework)`, or a method an agent framework plugin adds,
    such as `tuner.as_agentscope_model()`): every chat call the agent makes then goes through the
    gateway and is recorded, token by token, for training.

    A workflow instance is created per episode, so instance attributes are never shared between
    concurrent episodes.
    """

    name: str = ""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement execute(task, tuner)")
