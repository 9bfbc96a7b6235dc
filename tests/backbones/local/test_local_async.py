"""Asynchronous training's scheduling (backbones/local/async_rollouts.py): admission, the staleness
bound, dropped groups, and the tasks a checkpoint must keep.

The rollout here is a stand-in for the session's RolloutEngine that only takes time: each episode
"samples" its first token at the version the engine holds when it starts and its last one at the
version it holds when it ends (a partial rollout), and some tasks are delayed far past the others,
as a slow tool would. The engine's own per-token versions are tested in test_gateway_hf_engine.py;
a whole asynchronous run, killed and resumed, in test_local_async_run.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest

from agenttune.backbones.local.async_rollouts import GroupPipeline, staleness_metrics
from agenttune.backbones.local.loop import _check_engine
from agenttune.errors import UserError
from agenttune.workflow.episode import Episode, Sample
from agenttune.workflow.task import Task

BATCH = 4


class SlowRollout:
    """Runs a task's group in `delay(task)` seconds; its tokens carry the engine's versions."""

    def __init__(self, delays: dict[str, float], default: float = 0.01):
        self.delays, self.default = delays, default
        self.version = 0  # the rollout weights' version, as the engine would hold it
        self.running = 0
        self.most_running = 0
        self.priorities: dict[str, int | None] = {}  # task -> the engine priority its requests got

    async def run_tasks(self, tasks: list[Task], *, priority: int | None = None) -> list[Episode]:
        (task,) = tasks
        self.priorities[task.task_id] = priority
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        first = self.version
        await asyncio.sleep(self.delays.get(task.task_id, self.default))
        self.running -= 1
        sample = Sample(prompt_ids=[1], response_ids=[5, 6, 7], loss_mask=[1, 0, 1], logprobs=[-1.0, 0.0, -1.0],
                        policy_versions=[first, -1, self.version])
        return [Episode(episode_id=f"{task.task_id}-{i}", task=task, group_id=task.task_id, samples=[sample])
                for i in range(2)]


def task_source():
    numbers = itertools.count()

    def next_tasks() -> list[Task]:
        return [Task(task_id=f"t{next(numbers)}", query="q") for _ in range(BATCH)]

    return next_tasks


async def train(pipeline: GroupPipeline, rollout: SlowRollout, steps: int, *, train_s: float = 0.02):
    """The training loop's part: take a batch, "train" on it, bump the version."""
    trained, metrics = [], []
    for step in range(1, steps + 1):
        groups, step_metrics = await pipeline.next_batch()
        for group in groups:
            oldest = group.oldest_version()
            assert oldest is not None and pipeline.version - oldest <= pipeline.bound, "a stale group was trained"
        trained += [group.task.task_id for group in groups]
        metrics.append(step_metrics | staleness_metrics([e for g in groups for e in g.episodes], step - 1))
        await asyncio.sleep(train_s)
        rollout.version = step
        pipeline.advance(step)
    return trained, metrics


@pytest.mark.parametrize("bound", [0, 1, 2])
async def test_admission_keeps_rollouts_within_the_bound(bound):
    rollout = SlowRollout({})
    pipeline = GroupPipeline(rollout, task_source(), batch_size=BATCH, bound=bound, version=0)
    trained, metrics = await train(pipeline, rollout, steps=6)
    await pipeline.aclose()
    assert len(trained) == 6 * BATCH and len(set(trained)) == len(trained)
    assert rollout.most_running <= (bound + 1) * BATCH  # never more groups ahead than the bound allows
    # each group's requests wait for the engine in admission order: the oldest (trained next) first
    started = sorted(rollout.priorities, key=lambda task_id: rollout.priorities[task_id])
    assert sorted(rollout.priorities.values()) == list(range(len(started)))
    assert trained == started[:len(trained)]
    assert all(m["async/dropped_groups"] == 0 for m in metrics)  # nothing is slow: nothing dropped
    if bound == 0:  # synchronous: every token from the weights being trained
        assert all(m["async/staleness_max"] == 0 for m in metrics)
    else:
        assert max(m["async/staleness_max"] for m in metrics) >= 1  # later groups rolled out ahead


async def test_groups_delayed_past_the_bound_are_dropped_counted_and_replaced():
    slow = {"t5": 0.5, "t9": 0.5}  # a slow tool: these two (2nd and 3rd batches) finish several versions later
    rollout = SlowRollout(slow)
    pipeline = GroupPipeline(rollout, task_source(), batch_size=BATCH, bound=1, version=0)
    trained, metrics = await train(pipeline, rollout, steps=10, train_s=0.1)
    await pipeline.aclose()
    assert pipeline.dropped == 2 and sum(m["async/dropped_groups"] for m in metrics) == 2
    assert "t5" not in trained and "t9" not in trained
    assert len(trained) == 10 * BATCH and len(set(trained)) == len(trained)  # replaced by fresh groups
    for m in metrics:
        assert m["async/staleness_max"] <= 1
        assert sum(value for key, value in m.items() if key.startswith("async/staleness/")) == pytest.approx(1)


async def test_the_first_batch_rolls_out_alone_and_each_batch_taken_lets_one_more_in():
    """At the start the first batch has the engine to itself (as a synchronous step's would); each batch the
    trainer takes admits the next, up to the bound. `ahead()`: the next step's batch is complete already."""
    rollout = SlowRollout({}, default=0.05)
    pipeline = GroupPipeline(rollout, task_source(), batch_size=BATCH, bound=2, version=0)
    first, _ = await pipeline.next_batch()
    assert [group.task.task_id for group in first] == ["t0", "t1", "t2", "t3"]
    await asyncio.sleep(0.01)
    assert rollout.most_running == BATCH and rollout.running == BATCH  # the second batch started on taking
    assert not pipeline.ahead()
    await asyncio.sleep(0.2)
    assert pipeline.ahead() and rollout.running == 0
    await pipeline.next_batch()  # (no update yet: version 0) the third batch starts, and no more
    await pipeline.next_batch()
    await asyncio.sleep(0.2)
    assert sorted(rollout.priorities.values()) == list(range(3 * BATCH))  # bound 2: three batches of version 0
    await pipeline.aclose()


async def test_a_slow_group_within_the_bound_is_trained_with_its_partial_versions():
    rollout = SlowRollout({"t0": 0.08})  # finishes one update later, still within bound 2
    pipeline = GroupPipeline(rollout, task_source(), batch_size=BATCH, bound=2, version=0)
    trained, metrics = await train(pipeline, rollout, steps=4, train_s=0.05)
    await pipeline.aclose()
    assert "t0" in trained and pipeline.dropped == 0
    assert max(m["async/staleness_max"] for m in metrics) >= 1


async def test_pending_tasks_are_every_task_taken_and_not_trained():
    rollout = SlowRollout({"t5": 0.3})
    drawn: list[str] = []
    source = task_source()

    def next_tasks():
        tasks = source()
        drawn.extend(task.task_id for task in tasks)
        return tasks

    pipeline = GroupPipeline(rollout, next_tasks, batch_size=BATCH, bound=2, version=0)
    trained, _ = await train(pipeline, rollout, steps=3)
    pending = [task.task_id for task in pipeline.pending()]
    await pipeline.aclose()
    assert Counter(trained) + Counter(pending) == Counter(drawn)  # nothing lost, nothing twice
    assert "t5" in pending

    # A resumed run starts the pending tasks first, then draws new ones.
    fresh = SlowRollout({})
    fresh.version = 3  # the resumed run's weights: the checkpoint's step
    resumed = GroupPipeline(fresh, task_source(), batch_size=BATCH, bound=0, version=3,
                            pending=[Task(task_id=name, query="q") for name in pending])
    groups, _ = await resumed.next_batch()
    await resumed.aclose()
    assert {group.task.task_id for group in groups} <= set(pending)


async def test_a_failing_rollout_surfaces_instead_of_hanging():
    class Broken(SlowRollout):
        async def run_tasks(self, tasks, *, priority=None):
            raise RuntimeError("the gateway is gone")

    pipeline = GroupPipeline(Broken({}), task_source(), batch_size=BATCH, bound=1, version=0)
    with pytest.raises(RuntimeError, match="gateway is gone"):
        await asyncio.wait_for(pipeline.next_batch(), timeout=5)
    await pipeline.aclose()


def test_asynchronous_modes_need_an_engine_that_takes_weight_updates():
    from agenttune.components.engines.scripted import ScriptedEngine

    with pytest.raises(UserError, match="engine.type: hf"):
        _check_engine(ScriptedEngine(), bound=1)
    _check_engine(ScriptedEngine(), bound=None)  # synchronous: any engine


def test_staleness_counts_trained_tokens_only():
    sample = Sample(prompt_ids=[1], response_ids=[1, 2, 3, 4], loss_mask=[1, 1, 0, 1], logprobs=[0.0] * 4,
                    policy_versions=[3, 4, -1, 5])
    episode = Episode(episode_id="e", task=Task(task_id="t", query="q"), group_id="g", samples=[sample])
    metrics = staleness_metrics([episode], version=5)
    assert metrics["async/staleness/2"] == pytest.approx(1 / 3) and metrics["async/staleness/0"] == pytest.approx(1 / 3)
    assert metrics["async/staleness_max"] == 2 and metrics["async/staleness_mean"] == pytest.approx(1.0)
    assert staleness_metrics([episode.model_copy(update={"samples": []})], version=5) == {}


def test_asynchronous_training_with_rollout_correction_turned_off_is_warned_about():
    from structlog.testing import capture_logs

    from agenttune.backbones.local.loop import _warn_if_uncorrected
    from agenttune.registry.config_loading import load_config

    def warnings(*overrides: str) -> list[str]:
        config = load_config(None, list(overrides))
        with capture_logs() as logs:
            _warn_if_uncorrected(config, config.trainer.staleness_bound)
        return [entry["event"] for entry in logs if entry["log_level"] == "warning"]

    off = "algorithm.rollout_correction.rollout_is=null"
    [warning] = warnings("trainer.mode=async", "trainer.max_staleness=2", off)
    assert "rollout_is: token" in warning and "2 policy versions" in warning
    assert warnings("trainer.mode=one_step_off", off)  # one version off is still off-policy
    assert not warnings("trainer.mode=async")  # the default: token-level truncated importance sampling
    assert not warnings("trainer.mode=async", "algorithm.rollout_correction.rollout_is=sequence")
    assert not warnings("trainer.mode=sync")
    assert not warnings("trainer.mode=async", "trainer.max_staleness=0")  # the synchronous schedule


