"""Judges turn a finished episode into a reward."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttune.config.base import Component
from agenttune.workflow.base import WorkflowOutput
from agenttune.workflow.task import Task


class JudgeInput(BaseModel):
    """Everything a judge may look at for one episode."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    task: Task = Field(description="The task, with ground truth in metadata.")
    output: WorkflowOutput = Field(description="What the workflow returned.")
    handed: dict[str, Any] = Field(
        default_factory=dict,
        description="What the workflow handed the judge (tuner.update_judge_input_dictionary), e.g. final_answer.",
    )
    messages: list[dict[str, Any]] = Field(
        default_factory=list, description="The episode's conversation, OpenAI message dicts, in order."
    )

    @property
    def final_answer(self) -> Any:
        """The answer the workflow handed over, else the one in its output metadata, else None."""
        if "final_answer" in self.handed:
            return self.handed["final_answer"]
        return self.output.metadata.get("final_answer")

    @property
    def last_assistant_text(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "assistant" and isinstance(message.get("content"), str):
                return message["content"]
        return ""


class JudgeResult(BaseModel):
    reward: float = Field(description="The scalar reward used for training.")
    success: bool = Field(default=False, description="Whether the task counts as solved.")
    details: dict[str, Any] = Field(default_factory=dict, description="Anything worth logging.")
    turn_rewards: list[float] | None = Field(
        default=None, description="Optional: a reward for each model call of the episode, in the order of the calls "
                                  "(`len(judge_input.messages)`'s assistant turns of one agent). Estimators that use "
                                  "them (turn_grpo) give each call its own advantage; the others read only `reward`.")
    agent_rewards: dict[str, float] | None = Field(
        default=None, description="Optional, for several policies in one run: a reward for each agent of the episode "
                                  "(agent name -> reward). With `policies.reward: per_agent` each policy trains on "
                                  "its own agents' rewards; otherwise only `reward` (the team's) is read.")


class Judge(Component):
    """Scores an episode.

    A judge class has a unique `name` (the config's `judge.type`) and an `Options` pydantic model for
    its settings (the other keys of the `judge:` section). It is created once per run with its validated
    options and may keep clients open. `judge` may be async or plain; plain judges run in a thread.
    It must not mutate its input. Raising marks the episode `judge_error`; it never stops the batch.

    By default a judge runs in a worker process (config `judge.isolation`), so its class and options
    must be importable by name and it gets a pickled copy of its input; there `judge.timeout` and
    `judge.memory_limit_mb` are enforced by killing the worker's whole process tree. A judge that
    reads live objects from `judge_input.handed` (clients, handles) or shares process-global state
    with the trainer needs `isolation = "loop"` (async, awaiting a client of the trainer's event loop)
    or `"thread"` (docs/judges.md).
    """

    # Where the rollout engine calls `judge`: None follows the config's `judge.isolation`. "loop": on the
    # trainer's event loop, for judges that only await I/O and whose input may hold live clients.
    isolation: ClassVar[Literal["process", "thread", "loop"] | None] = None

    def __init__(self, options: BaseModel | None = None):
        self.options = options if options is not None else self.Options()

    def judge(self, judge_input: JudgeInput) -> JudgeResult | Awaitable[JudgeResult]:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement judge(judge_input)")

    async def aclose(self) -> None:
        """Release clients; called once at the end of the run."""
