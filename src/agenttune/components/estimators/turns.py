"""Per-turn credit: each call of an episode gets its own advantage from the rewards that followed it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.components.estimators.base import EPSILON, AdvantageEstimator, Advantages, Groups, Scored


class TurnGRPOOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount per call: a call's return is its own "
                         "turn reward plus gamma times the next call's return; the episode's reward comes after "
                         "the last call.")
    norm_by_std: bool = Field(default=True, description="Divide the centred returns by the group's std.")


def turn_returns(episode: Scored, gamma: float) -> list[float]:
    """The discounted return of every call: G_t = r_t + gamma G_{t+1}, with G_T the episode's reward.

    Without per-turn rewards every call's turn reward is 0, so each call's return is the discounted
    episode reward (with gamma 1: the episode's reward, as in GRPO)."""
    rewards = list(episode.turn_rewards) if episode.turn_rewards is not None else [0.0] * episode.calls
    returns = [0.0] * len(rewards)
    following = episode.reward
    for turn in reversed(range(len(rewards))):
        following = rewards[turn] + gamma * following
        returns[turn] = following
    return returns


class TurnGRPOEstimator(AdvantageEstimator):
    """GRPO over calls: every call's discounted return, centred on the mean of all the returns of its
    group's calls and divided by their std (Bessel-corrected; a group with a single call: mean 0, std 1,
    as GRPO treats a single episode)."""

    name = "turn_grpo"
    Options: ClassVar[type[BaseModel]] = TurnGRPOOptions
    uses_turn_rewards = True

    def estimate(self, groups: Groups) -> Advantages:
        options: TurnGRPOOptions = self.options  # type: ignore[assignment]
        result = Advantages()
        for members in groups.values():
            returns = {episode.episode_id: turn_returns(episode, options.gamma) for episode in members}
            pooled = [value for values in returns.values() for value in values]
            if len(pooled) > 1:
                mean = sum(pooled) / len(pooled)
                std = math.sqrt(sum((value - mean) ** 2 for value in pooled) / (len(pooled) - 1))
            else:
                mean, std = 0.0, 1.0
            for episode_id, values in returns.items():
                result.by_call[episode_id] = [
                    (value - mean) / (std + EPSILON) if options.norm_by_std else value - mean for value in values]
        return result

    def informative(self, group: Sequence[Scored]) -> bool:
        """Spread among the calls' returns (per-turn rewards can differ where episode rewards do not)."""
        pooled = [value for episode in group for value in turn_returns(episode, self.options.gamma)]  # type: ignore[attr-defined]
        return len(pooled) >= 2 and max(pooled) - min(pooled) > EPSILON
