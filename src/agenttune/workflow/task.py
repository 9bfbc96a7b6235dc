"""The one shape every task source is converted into."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Task(BaseModel):
    """One unit of work for an agent.

    Every task reader converts its rows into this shape, so workflows and judges never see the
    source format. Ground truth and everything else a judge may need goes into `metadata`.
    """

    task_id: str = Field(description="Stable identifier, unique within its split.")
    query: str = Field(default="", description="The main query (the user's first message).")
    init_messages: list[dict[str, Any]] = Field(
        default_factory=list, description="Messages to start from, for tasks that come with a conversation."
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Ground truth and any other columns of the source row."
    )
    env_type: str | None = Field(default=None, description="Environment type, for environment-backed tasks.")

    @property
    def main_query(self) -> str:
        """ASTune's name for `query`."""
        return self.query

    @property
    def task(self) -> Task:
        """ASTune workflows read `workflow_task.task.main_query`: a Task is its own WorkflowTask."""
        return self

    @property
    def ground_truth(self) -> Any:
        return self.metadata.get("ground_truth")


WorkflowTask = Task  # ASTune's name for what `Workflow.execute` receives
