"""Episodes and training samples: what rollouts produce and every backbone consumes.

These models are also the schema of the rollout log (`<run_dir>/rollouts/*.jsonl`), which the log
viewer reads. Change them only in backward-compatible ways (new fields with defaults).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from agenttune.task import Task


class EpisodeStatus(StrEnum):
    OK = "ok"
    WORKFLOW_ERROR = "workflow_error"  # the workflow raised
    TIMEOUT = "timeout"  # the episode ran past rollout.episode_timeout
    CANCELLED = "cancelled"
    JUDGE_ERROR = "judge_error"  # the judge raised or timed out
    ENGINE_ERROR = "engine_error"  # the inference engine failed a request the workflow could not survive
    MADNESS = "madness"  # a madness check fired; the penalty reward was applied
    NOT_TRAINABLE = "not_trainable"  # the engine returned text without token ids

    @property
    def failed(self) -> bool:
        return self not in (EpisodeStatus.OK, EpisodeStatus.MADNESS, EpisodeStatus.NOT_TRAINABLE)


class Sample(BaseModel):
    """One training sequence: consecutive LLM calls of one agent merged into prompt + response.

    `response_ids` holds everything after the first prompt: generated tokens (loss_mask 1) and the
    context inserted between calls — tool results, user turns, template glue (loss_mask 0).
    `logprobs` is aligned with `response_ids`: the sampling logprob where loss_mask is 1, 0.0 elsewhere.
    """

    agent: str = Field(default="default", description="The agent (model handle name) that produced it.")
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    num_calls: int = Field(default=1, description="How many LLM calls were merged into this sample.")
    trainable: bool = True

    def model_post_init(self, _context: Any) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"sample is misaligned: {n} response ids, {len(self.loss_mask)} mask entries, "
                f"{len(self.logprobs)} logprobs"
            )

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


class Episode(BaseModel):
    """One run of the workflow on one task, judged."""

    episode_id: str
    task: Task
    group_id: str = Field(description="Episodes of the same task in one step share a group (GRPO).")
    repeat_index: int = 0
    status: EpisodeStatus = EpisodeStatus.OK
    error: str | None = None
    reward: float = 0.0
    success: bool = False
    samples: list[Sample] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list, description="The conversation, in order.")
    output: dict[str, Any] = Field(default_factory=dict, description="The workflow output's metadata.")
    judge_details: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    started_at: float = 0.0
    duration_s: float = 0.0

    @property
    def trainable_samples(self) -> list[Sample]:
        return [sample for sample in self.samples if sample.trainable]
