"""A step's advantages: its episodes grouped, scored and handed to the configured estimator.

The estimator (`agenttune.components.estimators`) does the arithmetic; this module decides what it sees. Failed
episodes are left out (a crash says nothing about the policy) and counted. Groups without a
learning signal (the estimator's `informative` test: for grpo, every episode the same reward) are
kept with the advantage the estimator gives them (`zero_variance_groups: keep`, verl's behaviour:
their tokens stay in the token-mean denominator) or left out (`drop`). Rewards are first shaped by
DAPO's overlong penalty when `algorithm.overlong_shaping` is on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from agenttune.components.estimators.base import AdvantageEstimator, Scored
from agenttune.config.objective_options import OverlongShapingOptions
from agenttune.workflow.episode import Episode


@dataclass
class StepAdvantages:
    """Advantages of the episodes to train (per episode, or per call), plus what was left out and why."""

    by_episode: dict[str, float] = field(default_factory=dict)
    by_call: dict[str, list[float]] = field(default_factory=dict)
    num_groups: int = 0
    zero_variance_groups: int = 0  # groups without a learning signal (kept or dropped, as configured)
    failed_episodes: int = 0  # crashed, timed out, judge failed: not a verdict on the policy
    overlong_penalty: float = 0.0  # the sum of DAPO's penalties subtracted from rewards

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.num_groups if self.num_groups else 0.0


def scored(episode: Episode, overlong: OverlongShapingOptions | None = None) -> Scored:
    """What the estimator sees of an episode: its (shaped) reward, generated tokens, calls and turn rewards."""
    tokens = episode.generated_tokens
    penalty = overlong.shaping(tokens) if overlong is not None else 0.0
    turns = tuple(episode.turn_rewards) if episode.turn_rewards is not None else None
    return Scored(episode.episode_id, episode.reward - penalty, tokens=max(tokens, 1),
                  calls=sum(sample.num_calls for sample in episode.samples) or 1, turn_rewards=turns)


@dataclass
class ScoredGroups:
    groups: dict[str, list[Scored]]
    failed: int = 0
    overlong_penalty: float = 0.0


def scored_groups(episodes: Iterable[Episode], overlong: OverlongShapingOptions | None = None) -> ScoredGroups:
    """The episodes that did not fail, scored, by group; how many failed; the penalties subtracted."""
    result = ScoredGroups(defaultdict(list))
    for episode in episodes:
        if episode.status.failed:
            result.failed += 1
            continue
        member = scored(episode, overlong)
        result.groups[episode.group_id].append(member)
        result.overlong_penalty += episode.reward - member.reward
    result.groups = dict(result.groups)
    return result


def step_advantages(
    episodes: Iterable[Episode],
    estimator: AdvantageEstimator,
    *,
    zero_variance: Literal["keep", "drop"] = "keep",
    overlong: OverlongShapingOptions | None = None,
) -> StepAdvantages:
    found = scored_groups(episodes, overlong)
    groups = found.groups
    uninformative = {group_id for group_id, members in groups.items() if not estimator.informative(members)}
    if zero_variance == "drop":
        groups = {group_id: members for group_id, members in groups.items() if group_id not in uninformative}
    estimated = estimator.estimate(groups)
    return StepAdvantages(estimated.by_episode, estimated.by_call, num_groups=len(found.groups),
                          zero_variance_groups=len(uninformative), failed_episodes=found.failed,
                          overlong_penalty=found.overlong_penalty)


def per_row(episodes: Iterable[Episode], advantages: StepAdvantages) -> tuple[list[Episode], dict[str, float]]:
    """The episodes as the batch builder takes them, with one advantage per episode id.

    An episode with per-call advantages becomes one episode per call, whose sample is that call with
    everything before it as the prompt (`Sample.part`): each call trains with its own advantage.
    """
    rows: list[Episode] = []
    by_id = dict(advantages.by_episode)
    for episode in episodes:
        calls = advantages.by_call.get(episode.episode_id)
        if calls is None:
            rows.append(episode)
            continue
        index = 0
        for sample in episode.samples:
            spans = sample.calls
            for start, end in spans:
                if index >= len(calls):
                    break
                row_id = f"{episode.episode_id}/call{index}"
                rows.append(episode.model_copy(update={"episode_id": row_id, "samples": [sample.part(start, end)]}))
                by_id[row_id] = calls[index]
                index += 1
            index += max(0, sample.num_calls - len(spans))  # calls that generated nothing keep their place
    return rows, by_id
