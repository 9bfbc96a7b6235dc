"""Asynchronous rollouts: groups for later steps roll out while a step trains.

Agent episodes have long tails (a slow tool, a 30-turn episode); a synchronous step waits for its
slowest group while the trainer idles, then the trainer works while the engine idles. Here groups
(one task x `rollout.num_repeat` episodes) roll out continuously and the trainer takes the first
`train_batch_size` groups that are complete, as AReaL and verl's fully-async trainer do.

Staleness is counted in policy versions (optimizer steps applied to the weights that sampled a
token). The rollout engine samples from its own copy of the weights, refreshed after every update,
also in the middle of an episode (partial rollouts): each token records its version. Two rules keep
the data close to the policy being trained:

- Admission: a group starts only while at most `(version - start + bound + 1) x batch_size` groups
  (plus those dropped) have started, so rollouts never run more than `bound` versions ahead.
  With bound 0 this is the synchronous schedule.
- Staleness: a group whose oldest token lags the trained weights by more than `bound` versions is
  dropped and counted (`async/dropped_groups`); a fresh group starts in its place.

Tasks taken from the task order but not yet trained are `pending()`: a checkpoint stores them so a
resumed run starts them again instead of losing them (and draws nothing twice).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agenttune.config.run import get_logger
from agenttune.workflow.episode import Episode
from agenttune.workflow.task import Task

log = get_logger("local")

# Replacements for dropped groups start from the newest weights, so they are fresh: this many batches'
# worth of stale groups in a row means the engine's weights are not being updated at all.
STALE_IN_A_ROW = 10


@dataclass
class Group:
    """A task's episodes, finished."""

    order: int  # when its task was taken: accepted groups train in this order (deterministic batches)
    task: Task
    episodes: list[Episode]

    def oldest_version(self) -> int | None:
        versions = [sample.oldest_version for episode in self.episodes for sample in episode.samples]
        known = [version for version in versions if version is not None]
        return min(known) if known else None


class GroupPipeline:
    """Keeps groups rolling out ahead of training, within a staleness bound.

    `rollout` is the session's RolloutEngine, `next_tasks()` returns the next batch of tasks (the
    task order), `version` the policy version of the weights rollouts start from.
    """

    def __init__(self, rollout: Any, next_tasks: Any, *, batch_size: int, bound: int, version: int,
                 pending: Sequence[Task] = (), accept: Callable[[Group], bool] | None = None,
                 max_rejected: int = 0):
        self.rollout, self.next_tasks = rollout, next_tasks
        self.batch_size, self.bound = batch_size, bound
        # Dynamic sampling: groups `accept` refuses are replaced by fresh ones, at most `max_rejected` a step.
        self.accept, self.max_rejected = accept, max_rejected
        self.version = self._start_version = version
        self._queued: deque[tuple[int, Task]] = deque()
        self._numbers = itertools.count()
        for task in pending:  # a resumed run's unfinished groups go first
            self._queued.append((next(self._numbers), task))
        self._running: dict[asyncio.Task, tuple[int, Task]] = {}
        self._done: list[Group] = []
        self._arrived = asyncio.Event()
        self._failure: BaseException | None = None
        self._started = 0
        self._taken = 0  # batches handed to the trainer
        self.dropped = 0

    # -- what the training loop calls ---------------------------------------------------------------
    async def next_batch(self) -> tuple[list[Group], dict[str, float]]:
        """The next `batch_size` complete groups fresh enough to train the current version."""
        accepted: list[Group] = []
        dropped = rejected = 0
        while len(accepted) < self.batch_size:
            if rejected > self.max_rejected:  # dynamic sampling's retries are spent: train on what there is
                break
            self._fill()
            while not self._done:
                self._raise_failure()
                self._arrived.clear()
                await self._arrived.wait()
            # The earliest-drawn complete group first: it is the closest to going stale.
            group = min(self._done, key=lambda done: done.order)
            self._done.remove(group)
            oldest = group.oldest_version()
            if oldest is not None and self.version - oldest > self.bound:
                if dropped >= STALE_IN_A_ROW * self.batch_size:
                    raise RuntimeError(
                        f"{dropped} groups in a row were older than trainer.max_staleness ({self.bound}) allows: the "
                        f"rollout engine's weights are not refreshed (its tokens carry version {oldest}, "
                        f"training is at {self.version}).")
                dropped += 1
                self.dropped += 1  # widens admission by one: a fresh group replaces it
                log.info("stale group dropped", task=group.task.task_id, oldest=oldest, version=self.version)
                continue
            if self.accept is not None and not self.accept(group):
                rejected += 1
                self.dropped += 1  # widens admission by one: a fresh group replaces it
                continue
            accepted.append(group)
        accepted.sort(key=lambda group: group.order)
        self._taken += 1
        self._fill()
        metrics = {"async/dropped_groups": float(dropped), "async/dropped_groups_total": float(self.dropped),
                   "async/groups_in_flight": float(len(self._running)), "async/groups_waiting": float(len(self._done))}
        if self.accept is not None:
            metrics.update({"train/dynamic_sampling_discarded_groups": float(rejected),
                            "train/dynamic_sampling_short": float(self.batch_size - len(accepted)),
                            "train/informative_groups": float(len(accepted))})
        return accepted, metrics

    def ahead(self) -> bool:
        """Whether a whole batch is already complete for the next step: the rollout cannot speed that step
        up any more, so the update may take every core (and slow the rollout of the one after)."""
        return len(self._done) >= self.batch_size

    def advance(self, version: int) -> None:
        """The rollout weights are now `version`: admit the groups it allows."""
        self.version = version
        self._fill()

    def pending(self) -> list[Task]:
        """Tasks taken but not trained (running, finished and waiting, or queued), in the order taken."""
        waiting = [(group.order, group.task) for group in self._done]
        return [task for _, task in sorted([*self._running.values(), *waiting, *self._queued], key=lambda x: x[0])]

    async def aclose(self) -> None:
        for job in self._running:
            job.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()

    # -- inside -----------------------------------------------------------------------------------
    def _fill(self) -> None:
        allowed = (self.version - self._start_version + min(self.bound, self._taken) + 1) * self.batch_size + self.dropped
        while self._started < allowed:
            if not self._queued:
                self._queued.extend((next(self._numbers), task) for task in self.next_tasks())
            number, task = self._queued.popleft()
            job = asyncio.create_task(self._run(number, task), name=f"agenttune-group-{task.task_id}")
            self._running[job] = (number, task)
            self._started += 1

    async def _run(self, number: int, task: Task) -> None:
        try:
            # The oldest group's requests decode first: the trainer takes groups in this order, and at the
            # start the pipeline admits `bound + 1` batches at once (the first step waited for all of them).
            episodes = await self.rollout.run_tasks([task], priority=number)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # run_tasks isolates episodes: this is the rollout itself failing
            self._failure = error
        else:
            self._done.append(Group(number, task, episodes))
        finally:
            self._running.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            self._arrived.set()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


def staleness_metrics(episodes: list[Episode], version: int) -> dict[str, float]:
    """Per generated (trained) token: how many versions it lags the weights being trained."""
    lags: Counter[int] = Counter()
    for episode in episodes:
        for sample in episode.samples:
            for mask, token_version in zip(sample.loss_mask, sample.policy_versions or (), strict=False):
                if mask and token_version >= 0:
                    lags[version - token_version] += 1
    total = sum(lags.values())
    if not total:
        return {}
    metrics = {f"async/staleness/{lag}": count / total for lag, count in sorted(lags.items())}
    metrics["async/staleness_mean"] = sum(lag * count for lag, count in lags.items()) / total
    metrics["async/staleness_max"] = float(max(lags))
    return metrics
