"""From episodes to padded tensors: which tokens are trained, with which advantage, in which micro-batch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agenttune.episode import Episode


@dataclass
class TrainItem:
    """One sample as the trainer sees it: the whole sequence, with the mask aligned to it."""

    input_ids: list[int]
    loss_mask: list[int]  # 0 on the prompt and on inserted context, 1 on generated tokens
    sample_logprobs: list[float]  # the engine's sampling logprobs, aligned with input_ids
    advantage: float

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class ItemStats:
    samples: int = 0
    not_trainable: int = 0
    too_long_prompt: int = 0
    truncated_response: int = 0
    no_trained_tokens: int = 0
    response_lengths: list[int] = field(default_factory=list)


def build_items(
    episodes: Iterable[Episode],
    advantages: dict[str, float],
    *,
    max_prompt_length: int,
    max_response_length: int,
) -> tuple[list[TrainItem], ItemStats]:
    """Every trainable sample of every episode that has an advantage, cut to the configured lengths.

    Episodes without an advantage (zero-variance groups, failures) contribute nothing. A sample whose
    first prompt is longer than `max_prompt_length` is dropped; a longer response is cut (and counted).
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
            if len(sample.prompt_ids) > max_prompt_length:
                stats.too_long_prompt += 1
                continue
            response = sample.response_ids[:max_response_length]
            if len(response) < len(sample.response_ids):
                stats.truncated_response += 1
            mask = sample.loss_mask[: len(response)]
            if not any(mask):
                stats.no_trained_tokens += 1
                continue
            stats.response_lengths.append(len(response))
            prompt_len = len(sample.prompt_ids)
            items.append(TrainItem(
                input_ids=[*sample.prompt_ids, *response],
                loss_mask=[0] * prompt_len + list(mask),
                sample_logprobs=[0.0] * prompt_len + list(sample.logprobs[: len(response)]),
                advantage=advantage,
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
