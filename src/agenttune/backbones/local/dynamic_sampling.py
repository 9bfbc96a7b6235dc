"""DAPO's dynamic sampling: a step trains only on groups with a learning signal, and always on
`data.train_batch_size` of them when the retries allow.

A group is informative when the estimator says so (`AdvantageEstimator.informative`: for grpo, its
episodes did not all get the same reward; episodes that failed do not count). Uninformative groups
are discarded and fresh ones rolled out, at most `algorithm.dynamic_sampling.max_retries` extra
rounds per step; the surplus of the last round is discarded too, so the trained batch size stays
constant. When the retries are spent the step trains on what it has and says so in its metrics.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from agenttune.backbones.local.advantages import scored_groups
from agenttune.components.estimators.base import AdvantageEstimator
from agenttune.config.objective_options import OverlongShapingOptions
from agenttune.workflow.episode import Episode


def split_groups(episodes: Iterable[Episode]) -> list[list[Episode]]:
    """Episodes by group, in the order the groups first appear."""
    groups: dict[str, list[Episode]] = {}
    for episode in episodes:
        groups.setdefault(episode.group_id, []).append(episode)
    return list(groups.values())


def is_informative(group: list[Episode], estimator: AdvantageEstimator,
                   overlong: OverlongShapingOptions | None = None) -> bool:
    scored = scored_groups(group, overlong).groups
    return any(estimator.informative(members) for members in scored.values())


async def fill_batch(
    first: list[Episode],
    more: Callable[[], Awaitable[list[Episode]]],
    *,
    estimator: AdvantageEstimator,
    batch_size: int,
    max_retries: int,
    overlong: OverlongShapingOptions | None = None,
) -> tuple[list[Episode], list[Episode], dict[str, float]]:
    """(episodes to train, every episode rolled out, metrics): `more()` rolls out a fresh batch."""
    rolled_out = list(first)
    kept: list[list[Episode]] = []
    discarded = rounds = 0
    episodes = first
    while True:
        for group in split_groups(episodes):
            if is_informative(group, estimator, overlong):
                kept.append(group)
            else:
                discarded += 1
        if len(kept) >= batch_size or rounds >= max_retries:
            break
        rounds += 1
        episodes = await more()
        rolled_out += episodes
    surplus = max(0, len(kept) - batch_size)
    kept = kept[:batch_size]
    metrics = {
        "train/dynamic_sampling_rounds": float(rounds),
        "train/dynamic_sampling_discarded_groups": float(discarded),
        "train/dynamic_sampling_surplus_groups": float(surplus),
        "train/dynamic_sampling_short": float(batch_size - len(kept)),
        "train/informative_groups": float(len(kept)),
    }
    return [episode for group in kept for episode in group], rolled_out, metrics
