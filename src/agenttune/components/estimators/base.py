"""The advantage-estimator contract: from the judged rewards of a step's groups to advantages.

An estimator sees each group as a list of `Scored` episodes (the failed ones are already left out:
a crash says nothing about the policy) and returns one advantage per episode, or, when it uses the
judge's per-turn rewards, one per call. Pure Python on purpose: this is the part of an RL objective
that is easiest to get subtly wrong, so it stays free of tensors and is tested against direct
computations and against verl's registered functions (plugins/verl/tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel

from agenttune.config.base import Component
from agenttune.errors import UserError

EPSILON = 1e-6  # verl's and TRL's epsilon in the std normalisation


@dataclass(frozen=True)
class Scored:
    """What an estimator sees of one episode."""

    episode_id: str
    reward: float
    tokens: int = 1  # generated (trained) tokens: batch-wide whitening weighs episodes by them, as verl does
    calls: int = 1  # the episode's model calls
    turn_rewards: tuple[float, ...] | None = None  # one per call, when the judge gave them


Groups = Mapping[str, Sequence[Scored]]  # group id -> its episodes


@dataclass
class Advantages:
    """One advantage per episode, or per call for the episodes in `by_call`."""

    by_episode: dict[str, float] = field(default_factory=dict)
    by_call: dict[str, list[float]] = field(default_factory=dict)


def has_spread(group: Sequence[Scored]) -> bool:
    """At least two episodes and not all of the same reward: a group the policy can learn from."""
    rewards = [episode.reward for episode in group]
    return len(rewards) >= 2 and max(rewards) - min(rewards) > EPSILON


class AdvantageEstimator(Component):
    """Turns a step's groups of judged episodes into advantages.

    A class has a unique `name` (what `algorithm.adv_estimator` selects) and an `Options` model (the
    keys of `algorithm.estimator_options`). `min_group_size` is the smallest `rollout.num_repeat` it
    can learn from: 2 for estimators that compare an episode with its group, 1 for those with a
    batch-wide baseline. `uses_turn_rewards`: it reads `Scored.turn_rewards` and returns `by_call`.
    """

    min_group_size: ClassVar[int] = 2
    uses_turn_rewards: ClassVar[bool] = False

    def __init__(self, options: BaseModel | None = None):
        self.options = options if options is not None else self.Options()

    @classmethod
    def check_group_size(cls, num_repeat: int) -> None:
        """A UserError when `rollout.num_repeat` gives groups too small to learn from (training backbones
        call it before they start)."""
        if num_repeat < cls.min_group_size:
            raise UserError(
                f"rollout.num_repeat is {num_repeat}, but the {cls.name!r} advantage estimator compares each episode "
                f"with the others of its group and needs groups of at least {cls.min_group_size}: nothing would be "
                "trained.",
                hint="Raise rollout.num_repeat (4 to 16 is usual), or choose an estimator with a batch-wide baseline: "
                     "algorithm.adv_estimator: reinforce_plus_plus_baseline.")

    def estimate(self, groups: Groups) -> Advantages:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement estimate(groups)")

    def informative(self, group: Sequence[Scored]) -> bool:
        """Whether this group carries a learning signal (dynamic sampling keeps only those, and
        `algorithm.zero_variance_groups: drop` drops the others). Default: reward spread."""
        return has_spread(group)
