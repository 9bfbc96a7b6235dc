"""GRPO advantages: each episode's reward compared with the other episodes of its group.

Pure Python on purpose: it is the part of GRPO that is easiest to get subtly wrong, so it is kept
free of tensors and tested against an independent computation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from agenttune.episode import Episode

EPSILON = 1e-6


@dataclass
class GroupAdvantages:
    """Advantages of the episodes that carry a learning signal, plus what was skipped and why."""

    by_episode: dict[str, float] = field(default_factory=dict)
    num_groups: int = 0
    zero_variance_groups: int = 0  # every episode got the same reward: nothing to learn from
    failed_episodes: int = 0  # crashed, timed out, judge failed: not a verdict on the policy

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.num_groups if self.num_groups else 0.0


def group_advantages(episodes: Iterable[Episode], *, norm_by_std: bool = True) -> GroupAdvantages:
    """Centre each reward on its group's mean and, when `norm_by_std`, divide by the group's std.

    The std is the sample standard deviation (Bessel-corrected, as in verl and TRL). Failed episodes
    are left out of the statistics: an engine crash says nothing about the policy. A group whose
    rewards are all equal (or that has a single episode left) gives no advantage at all and is counted.
    """
    groups: dict[str, list[Episode]] = defaultdict(list)
    result = GroupAdvantages()
    for episode in episodes:
        if episode.status.failed:
            result.failed_episodes += 1
            continue
        groups[episode.group_id].append(episode)
    for members in groups.values():
        result.num_groups += 1
        rewards = [episode.reward for episode in members]
        mean = sum(rewards) / len(rewards)
        spread = max(rewards) - min(rewards)
        if len(rewards) < 2 or spread <= EPSILON:
            result.zero_variance_groups += 1
            continue
        std = math.sqrt(sum((reward - mean) ** 2 for reward in rewards) / (len(rewards) - 1))
        for episode in members:
            centred = episode.reward - mean
            result.by_episode[episode.episode_id] = centred / (std + EPSILON) if norm_by_std else centred
    return result
