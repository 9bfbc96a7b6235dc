"""Outcome estimators: one advantage per episode, from its reward and its group's.

Each follows verl 0.9.1's registered function of the same name exactly, single-episode groups
included (plugins/verl/tests/test_verl_estimators.py compares them on random batches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.components.estimators.base import (
    EPSILON,
    AdvantageEstimator,
    Advantages,
    Groups,
    Scored,
    has_spread,
)


class GRPOOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    norm_by_std: bool = Field(default=True, description="Divide the centred rewards by the group's std "
                                                        "(verl's norm_adv_by_std_in_grpo).")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _sample_std(values: Sequence[float]) -> float:
    mean = _mean(values)
    return math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1))


class GRPOEstimator(AdvantageEstimator):
    """(reward - group mean) / (group std + 1e-6), the std Bessel-corrected as in verl and TRL.

    A group of one episode has mean 0 and std 1 (verl's rule): its advantage is its reward."""

    name = "grpo"
    Options: ClassVar[type[BaseModel]] = GRPOOptions
    norm_by_std: ClassVar[bool | None] = None  # None: the option decides

    def estimate(self, groups: Groups) -> Advantages:
        norm = self.norm_by_std if self.norm_by_std is not None else self.options.norm_by_std  # type: ignore[attr-defined]
        result = Advantages()
        for members in groups.values():
            rewards = [episode.reward for episode in members]
            mean, std = (0.0, 1.0) if len(rewards) == 1 else (_mean(rewards), _sample_std(rewards))
            for episode in members:
                centred = episode.reward - mean
                result.by_episode[episode.episode_id] = centred / (std + EPSILON) if norm else centred
        return result


class DrGRPOEstimator(GRPOEstimator):
    """Dr. GRPO (Liu et al., 2025): the reward centred on its group's mean, not divided by the std,
    which over-weights nearly-unanimous groups. Pair it with `loss_agg_mode: seq-mean-token-sum-norm`
    for the paper's full recipe."""

    name = "dr_grpo"
    Options: ClassVar[type[BaseModel]] = AdvantageEstimator.Options
    norm_by_std = False


class RLOOEstimator(AdvantageEstimator):
    """REINFORCE leave-one-out: the reward minus the mean reward of the group's other episodes.

    A group of one keeps its reward (verl's rule)."""

    name = "rloo"

    def estimate(self, groups: Groups) -> Advantages:
        result = Advantages()
        for members in groups.values():
            rewards = [episode.reward for episode in members]
            size = len(rewards)
            total = sum(rewards)
            for episode in members:
                others = (total - episode.reward) / (size - 1) if size > 1 else 0.0
                result.by_episode[episode.episode_id] = episode.reward - others
        return result


class ReinforcePlusPlusBaselineEstimator(AdvantageEstimator):
    """REINFORCE++ with a group baseline: the reward minus its group's mean (0 for a group of one),
    then whitened over the whole batch, each episode weighed by its generated tokens (verl's
    `masked_whiten` over the response tokens). Learns from single-episode groups (num_repeat 1)."""

    name = "reinforce_plus_plus_baseline"
    min_group_size = 1

    def estimate(self, groups: Groups) -> Advantages:
        centred: list[tuple[Scored, float]] = []
        for members in groups.values():
            mean = _mean([episode.reward for episode in members]) if len(members) > 1 else 0.0
            centred += [(episode, episode.reward - mean) for episode in members]
        tokens = sum(episode.tokens for episode, _ in centred)
        if tokens < 2:  # a variance needs two tokens; nothing to whiten
            return Advantages({episode.episode_id: 0.0 for episode, _ in centred})
        mean = sum(episode.tokens * value for episode, value in centred) / tokens
        variance = sum(episode.tokens * (value - mean) ** 2 for episode, value in centred) / tokens
        variance *= tokens / (tokens - 1)  # Bessel's correction over tokens, as verl's masked_var
        scale = 1.0 / math.sqrt(variance + 1e-8)
        return Advantages({episode.episode_id: (value - mean) * scale for episode, value in centred})

    def informative(self, group: Sequence[Scored]) -> bool:
        """A lone episode is compared with the batch; a larger group only through its spread."""
        return len(group) == 1 or has_spread(group)
