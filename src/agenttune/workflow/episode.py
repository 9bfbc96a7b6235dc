"""Episodes and training samples: what rollouts produce and every backbone consumes.

These models are also the schema of the rollout log (`<run_dir>/rollouts/*.jsonl`), which the log
viewer reads. Change them only in backward-compatible ways (new fields with defaults).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from agenttune.workflow.task import Task


class EpisodeStatus(StrEnum):
    OK = "ok"
    WORKFLOW_ERROR = "workflow_error"  # the workflow raised
    TIMEOUT = "timeout"  # the episode ran past rollout.episode_timeout
    # An async workflow blocked the event loop past rollout.episode_timeout (time.sleep, a blocking
    # socket, a busy loop): the loop watchdog interrupted it (rollout/loop_watchdog.py).
    WORKFLOW_BLOCKED = "workflow_blocked"
    CANCELLED = "cancelled"
    JUDGE_ERROR = "judge_error"  # the judge raised, returned garbage, or its worker died
    JUDGE_TIMEOUT = "judge_timeout"  # the judge ran past judge.timeout (its process tree was killed)
    JUDGE_MEMORY = "judge_memory"  # the judge went over judge.memory_limit_mb (its process tree was killed)
    ENGINE_ERROR = "engine_error"  # the inference engine failed a request the workflow could not survive
    MADNESS = "madness"  # a madness check fired; the penalty reward was applied
    NOT_TRAINABLE = "not_trainable"  # the engine returned text without token ids
    # The conversation outgrew model.max_model_len (the gateway refused a call) and the workflow stopped
    # there: a normal end, not a crash. Its samples are trained; the judge (or
    # rollout.context_overflow_reward) scores it.
    CONTEXT_OVERFLOW = "context_overflow"
    # An agent asked for more than rollout.max_turns model calls (the gateway refused it) and the workflow
    # stopped there: a normal end, scored by the judge (or rollout.turn_limit_reward).
    TURN_LIMIT = "turn_limit"
    # The episode's environment failed it (a server that died, never answered or refused): the workflow
    # raised EnvironmentFailure. Not the agent's fault, so counted apart from workflow_error.
    ENVIRONMENT_ERROR = "environment_error"

    @property
    def failed(self) -> bool:
        return self not in (EpisodeStatus.OK, EpisodeStatus.MADNESS, EpisodeStatus.NOT_TRAINABLE,
                            EpisodeStatus.CONTEXT_OVERFLOW, EpisodeStatus.TURN_LIMIT)


class EnvironmentFailure(RuntimeError):
    """Raised by an environment client when the episode's environment (not the agent) failed.

    The rollout engine records the episode as `environment_error` instead of `workflow_error`, so that
    a dying or silent environment server is counted by cause; plugins raise it (agenttune_openenv).
    """


class Sample(BaseModel):
    """One training sequence: consecutive LLM calls of one agent merged into prompt + response.

    `response_ids` holds everything after the first prompt: generated tokens (loss_mask 1) and the
    context inserted between calls — tool results, user turns, template glue (loss_mask 0).
    `logprobs` is aligned with `response_ids`: the sampling logprob where loss_mask is 1, 0.0 elsewhere.
    """

    agent: str = Field(default="default", description="The agent (model handle name) that produced it.")
    policy: str | None = Field(
        default=None, description="The policy (LoRA adapter, `policies:`) that sampled it; None: the run has one "
                                  "policy, or this agent sampled from the base model.")
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    num_calls: int = Field(default=1, description="How many LLM calls were merged into this sample.")
    trainable: bool = True
    engine_logprobs: bool = Field(
        default=True, description="False: the engine reports no logprobs (it declares so); `logprobs` holds "
                                  "placeholders and the trainer recomputes them.")
    policy_versions: list[int] | None = Field(
        default=None, description="Aligned with `response_ids`: the policy version (optimizer updates) that "
                                  "sampled each generated token, -1 for context tokens. None: the engine does "
                                  "not track versions.")
    call_spans: list[tuple[int, int]] | None = Field(
        default=None, description="Where each LLM call's reply lies in `response_ids` (start, end), as the "
                                  "gateway recorded the calls: grammar-forced tokens inside a reply (loss mask 0) "
                                  "do not split it. None: a sample recorded without them (agenttune < 0.2); "
                                  "the runs of loss mask 1 stand in for the calls.")

    def model_post_init(self, _context: Any) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"sample is misaligned: {n} response ids, {len(self.loss_mask)} mask entries, "
                f"{len(self.logprobs)} logprobs"
            )
        if self.policy_versions is not None and len(self.policy_versions) != n:
            raise ValueError(f"sample is misaligned: {n} response ids, {len(self.policy_versions)} policy versions")
        if self.call_spans is not None:
            ends = [0] + [position for span in self.call_spans for position in span] + [n]
            if len(self.call_spans) != self.num_calls or ends != sorted(ends):
                raise ValueError(f"sample has {self.num_calls} calls but call spans {self.call_spans} "
                                 f"(in order, within its {n} response ids, one per call)")

    @property
    def calls(self) -> list[tuple[int, int]]:
        """(start, end) of each call's reply in `response_ids`: the gateway's record of the calls."""
        return self.call_spans if self.call_spans is not None else _generated_runs(self.loss_mask)

    @property
    def oldest_version(self) -> int | None:
        """The oldest policy version among the generated tokens (None: not tracked)."""
        generated = [version for version in self.policy_versions or () if version >= 0]
        return min(generated) if generated else None

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)

    def part(self, start: int, end: int) -> Sample:
        """The calls in `response_ids[start:end]` (whole calls: it starts at one's start and ends at one's
        end) as a sample of their own: what came before is its prompt."""
        spans = [(first - start, last - start) for first, last in self.calls if start <= first and last <= end]
        return self.model_copy(update={
            "prompt_ids": self.prompt_ids + self.response_ids[:start], "response_ids": self.response_ids[start:end],
            "loss_mask": self.loss_mask[start:end], "logprobs": self.logprobs[start:end], "num_calls": len(spans),
            "call_spans": spans,
            "policy_versions": None if self.policy_versions is None else self.policy_versions[start:end]})


@dataclass
class Fitted:
    """A sample made to fit a trainer's limits: the parts to train, and what could not be kept."""

    parts: list[Sample]
    split: int = 0  # samples longer than the limits, cut at call boundaries (0 or 1 for one sample)
    # Calls that fit in no part, by reason, each counted under its own: prompt_too_long (the prompt
    # up to the call is over the limit) or call_too_long (the call's own reply is).
    dropped: Counter[str] = field(default_factory=Counter)
    dropped_tokens: int = 0  # generated tokens in dropped calls (fit_all counts them)

    @property
    def dropped_calls(self) -> int:
        return sum(self.dropped.values())


def fit_to_limits(sample: Sample, max_prompt_length: int, max_response_length: int) -> Fitted:
    """Split a merged sample at call boundaries so that every part fits; never cut inside a call.

    Each part keeps its own full prompt (the first prompt plus everything before its first call), so
    a part is exactly what the engine saw when it generated those calls. Calls whose prompt is longer
    than `max_prompt_length`, or whose own reply is longer than `max_response_length`, fit in no part
    and are dropped, each counted under its reason. The calls are the gateway's record of them
    (`Sample.calls`), never the runs of the loss mask: a guided reply has untrained (grammar-forced)
    tokens inside it and is still one call.
    """
    if len(sample.prompt_ids) <= max_prompt_length and len(sample.response_ids) <= max_response_length:
        return Fitted([sample])
    calls = sample.calls
    fitted = Fitted([], split=1)
    index = 0
    while index < len(calls):
        start = calls[index][0]
        if len(sample.prompt_ids) + start > max_prompt_length:  # later calls' prompts are longer still
            fitted.dropped["prompt_too_long"] += len(calls) - index
            break
        if calls[index][1] - start > max_response_length:
            fitted.dropped["call_too_long"] += 1
            index += 1
            continue
        last = index
        while last + 1 < len(calls) and calls[last + 1][1] - start <= max_response_length:
            last += 1
        fitted.parts.append(sample.part(start, calls[last][1]))
        index = last + 1
    return fitted


def fit_all(samples: list[Sample], max_prompt_length: int, max_response_length: int) -> Fitted:
    """`fit_to_limits` for several samples: all their parts, and what was split or dropped in all."""
    total = Fitted([])
    for sample in samples:
        fitted = fit_to_limits(sample, max_prompt_length, max_response_length)
        total.parts += fitted.parts
        total.split += fitted.split
        total.dropped.update(fitted.dropped)
        total.dropped_tokens += sample.num_trained_tokens - sum(part.num_trained_tokens for part in fitted.parts)
    return total


def record_fitting(episode: Episode, fitted: Fitted, limits: str) -> None:
    """Count on the episode what fitting its samples split and dropped (`truncation/...`); warn on a drop."""
    episode.metrics["truncation/samples_split"] = float(fitted.split)
    episode.metrics["truncation/calls_dropped"] = float(fitted.dropped_calls)
    for reason, count in fitted.dropped.items():
        episode.metrics[f"truncation/calls_dropped/{reason}"] = float(count)
    episode.metrics["truncation/trained_tokens_dropped"] = float(fitted.dropped_tokens)
    if fitted.dropped_calls:
        import structlog  # here, not at the top: `import agenttune` (and `agenttune --help`) stays light

        structlog.get_logger("agenttune.fitting").warning(
            f"episode {episode.episode_id}: {fitted.dropped_calls} calls ({fitted.dropped_tokens} generated tokens) "
            f"fit in no sample within {limits} and were dropped; raise the limits to train on them")


def _generated_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every run of 1s: the calls' generated tokens."""
    runs: list[tuple[int, int]] = []
    start = None
    for position, value in enumerate([*mask, 0]):
        if value and start is None:
            start = position
        elif not value and start is not None:
            runs.append((start, position))
            start = None
    return runs


class Episode(BaseModel):
    """One run of the workflow on one task, judged."""

    episode_id: str
    task: Task
    group_id: str = Field(description="Episodes of the same task in one step share a group (GRPO).")
    repeat_index: int = 0
    status: EpisodeStatus = EpisodeStatus.OK
    error: str | None = None
    reward: float = 0.0
    turn_rewards: list[float] | None = Field(
        default=None, description="The judge's reward for each model call, in the order of the calls (samples in "
                                  "order, each sample's calls in order); None: the judge gave only the episode's.")
    agent_rewards: dict[str, float] | None = Field(
        default=None, description="The judge's reward for each agent (agent name -> reward), for `policies.reward: "
                                  "per_agent`; None: the judge gave only the team's.")
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

    @property
    def num_calls(self) -> int:
        return sum(sample.num_calls for sample in self.samples)

    @property
    def generated_tokens(self) -> int:
        """The tokens the trained model generated in this episode: what DAPO's overlong penalty counts."""
        return sum(sample.num_trained_tokens for sample in self.trainable_samples)
