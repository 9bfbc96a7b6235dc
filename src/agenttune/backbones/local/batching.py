"""From episodes to padded tensors: which tokens are trained, with which advantage, in which micro-batch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agenttune.workflow.episode import Episode, fit_to_limits


@dataclass
class TrainItem:
    """One sample as the trainer sees it: the whole sequence, with the mask aligned to it."""

    input_ids: list[int]
    loss_mask: list[int]  # 0 on the prompt and on inserted context, 1 on generated tokens
    sample_logprobs: list[float]  # the engine's sampling logprobs, aligned with input_ids
    advantage: float
    engine_logprobs: bool = True  # False: the engine reported none; the trainer uses its own

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class ItemStats:
    samples: int = 0
    not_trainable: int = 0
    too_long_prompt: int = 0  # samples whose first prompt alone is over the limit: dropped whole
    split: int = 0  # samples longer than the limits, cut at call boundaries into parts that fit
    dropped_calls: dict[str, int] = field(default_factory=dict)  # calls in no part, by reason
    no_trained_tokens: int = 0
    logprobs_recomputed: int = 0  # samples from an engine that reports no logprobs
    response_lengths: list[int] = field(default_factory=list)


def build_items(
    episodes: Iterable[Episode],
    advantages: dict[str, float],
    *,
    max_prompt_length: int,
    max_response_length: int,
) -> tuple[list[TrainItem], ItemStats]:
    """Every trainable sample of every episode that has an advantage, made to fit the configured lengths.

    Episodes without an advantage (zero-variance groups, failures) contribute nothing. A sample longer
    than the limits is split at call boundaries (`fit_to_limits`: each part keeps its full prompt);
    calls that fit in no part are dropped and counted by reason. Nothing is cut inside a call.
    """
    items: list[TrainItem] = []
    stats = ItemStats()
    for episode in episodes:
        advantage = advantages.get(episode.episode_id)
        if advantage is None:
            continue
        for sample in episode.samples:
            stats.samples += 1
            if not sample.trainable:
                stats.not_trainable += 1
                continue
            fitted = fit_to_limits(sample, max_prompt_length, max_response_length)
            stats.split += fitted.split
            for reason, count in fitted.dropped.items():  # each dropped call under its own reason
                stats.dropped_calls[reason] = stats.dropped_calls.get(reason, 0) + count
            if not fitted.parts and set(fitted.dropped) == {"prompt_too_long"}:  # even the first call's
                stats.too_long_prompt += 1
            stats.logprobs_recomputed += not sample.engine_logprobs
            for part in fitted.parts:
                if not any(part.loss_mask):
                    stats.no_trained_tokens += 1
                    continue
                stats.response_lengths.append(len(part.response_ids))
                prompt_len = len(part.prompt_ids)
                items.append(TrainItem(
                    input_ids=[*part.prompt_ids, *part.response_ids],
                    loss_mask=[0] * prompt_len + list(part.loss_mask),
                    sample_logprobs=[0.0] * prompt_len + list(part.logprobs),
                    advantage=advantage,
                    engine_logprobs=part.engine_logprobs,
                ))
    return items, stats


def micro_batches(items: list[TrainItem], token_budget: int) -> list[list[TrainItem]]:
    """Group items so that rows x longest row (the padded size) stays within `token_budget`.

    Items are sorted by length first so that rows of similar length share a batch and little
    padding is computed. An item longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[TrainItem]] = []
    current: list[TrainItem] = []
    for item in sorted(items, key=len, reverse=True):
        longest = len(current[0]) if current else len(item)
        if current and (len(current) + 1) * longest > token_budget:
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches
