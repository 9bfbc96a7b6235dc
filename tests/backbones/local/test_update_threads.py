"""On CPU the update's micro-batches run on threads of their own, one intra-op thread each (issue 39)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from test_local_grpo import make_config, make_trainer, parameters, step_episodes  # noqa: E402

from agenttune.backbones.local.loop import update_executor  # noqa: E402
from agenttune.backbones.local.packing import balanced_micro_batches  # noqa: E402
from agenttune.backbones.local.update_threads import UpdateThreads  # noqa: E402


def test_each_worker_computes_on_one_intra_op_thread_and_the_callers_count_stays():
    callers = torch.get_num_threads()
    threads = UpdateThreads(3)
    try:
        seen = list(threads.map(lambda _: (torch.get_num_threads(), threading.current_thread().name), range(9)))
    finally:
        threads.close()
    assert {count for count, _ in seen} == {1}
    assert all(name.startswith("agenttune-update-worker") for _, name in seen)
    assert torch.get_num_threads() == callers
    later: list[int] = []
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert later == [callers]  # threads started afterwards begin with the caller's count, not one


def test_results_come_in_order_a_few_at_a_time_and_a_failure_is_raised():
    threads = UpdateThreads(2)
    drawn: list[int] = []

    def items():
        for item in range(8):
            drawn.append(item)
            yield item

    def slower_first(item: int) -> int:
        time.sleep(0.02 * (8 - item))  # later items finish first
        return item * item

    try:
        results = threads.map(slower_first, items())
        assert next(results) == 0
        assert len(drawn) == 3  # at most size + 1 results (whole sets of gradients) wait to be taken
        assert list(results) == [item * item for item in range(1, 8)]

        def failing(item: int) -> int:
            if item == 2:
                raise ValueError("micro-batch 2")
            return item

        with pytest.raises(ValueError, match="micro-batch 2"):
            list(threads.map(failing, range(6)))
    finally:
        threads.close()


def test_a_step_is_split_into_several_micro_batches_per_thread():
    class Sized:  # balanced_micro_batches reads len() only
        def __init__(self, length: int):
            self.length = length

        def __len__(self) -> int:
            return self.length

    many = [Sized(length) for length in (30, 25, 20, 20, 15, 10, 10, 8, 6, 5, 4, 3)]
    assert len(balanced_micro_batches(many, 10_000)) == 1
    split = balanced_micro_batches(many, 10_000, at_least=8)
    assert len(split) == 8 and sorted(map(id, sum(split, []))) == sorted(map(id, many))
    assert len(balanced_micro_batches(many[:3], 10_000, at_least=8)) == 3  # no more than there are units
    assert len(balanced_micro_batches(many, 40, at_least=2)) == 4  # the budget still rules


@pytest.mark.parametrize("extra", [
    {},
    {"ppo_epochs": 2},  # a scoring pass of the old policy, also on the threads
    {"lora_rank": 4, "lora_alpha": 8},
])
def test_an_update_on_threads_equals_one_micro_batch_after_another(extra):
    """Same micro-batches (a budget that splits the step into as many as the threads need), one thread vs
    two: the same weights and metrics, up to the float noise of a different intra-op thread count; two
    threaded runs give the very same weights (gradients are added in micro-batch order)."""
    outcomes = []
    for threads in (1, 2, 2):
        config = make_config(local={"micro_batch_tokens": 20, "update_threads": threads, **extra},
                             algorithm={"kl_coef": 0.1})
        trainer = make_trainer(config)
        where: set[str] = set()
        trainer.model.get_input_embeddings().register_forward_pre_hook(
            lambda *_, where=where: where.add(threading.current_thread().name))
        before = parameters(trainer.model)
        metrics = [trainer.step(step_episodes(step)) for step in range(2)]
        trainer.close()
        outcomes.append((before, parameters(trainer.model), metrics, where))
    (before, serial, serial_metrics, serial_where), (_, threaded, threaded_metrics, threaded_where), \
        (_, again, _, _) = outcomes
    assert threaded_metrics[0]["train/micro_batches"] == serial_metrics[0]["train/micro_batches"] == 8
    assert serial_where == {"MainThread"}
    assert any(name.startswith("agenttune-update-worker") for name in threaded_where)
    assert any(not torch.equal(serial[name], before[name]) for name in serial)
    for name in serial:
        torch.testing.assert_close(threaded[name], serial[name], rtol=0, atol=1e-6)
        assert torch.equal(again[name], threaded[name])
    for old, new in zip(serial_metrics, threaded_metrics, strict=True):
        for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm",
                    "train/trained_tokens"):
            assert new[key] == pytest.approx(old[key], rel=1e-5, abs=1e-7), key


def test_threads_split_a_small_step_and_leave_the_update_as_it_was():
    """A budget that would hold the step in one micro-batch: on two threads it becomes eight (four per
    thread), and the update is that of one big batch."""
    results = []
    for threads in (1, 2):
        trainer = make_trainer(make_config(local={"micro_batch_tokens": 100_000, "update_threads": threads}))
        metrics = trainer.step(step_episodes(1))
        trainer.close()
        results.append((parameters(trainer.model), metrics["train/micro_batches"]))
    (one_batch, one), (split, many) = results
    assert one == 1 and many == 8
    for name in one_batch:
        torch.testing.assert_close(split[name], one_batch[name], rtol=0, atol=1e-5)


def test_the_asynchronous_update_thread_only_gathers_when_the_update_has_threads():
    """With threads of its own the update's thread computes on one intra-op thread; a one-thread update
    computes there on the cores the engine's decode thread leaves (two OpenMP teams as wide as the machine
    wait for each other's preempted threads); off CPU it is a plain thread. The caller's count stays."""
    callers = torch.get_num_threads()

    def threads_of(update_threads: int, engine) -> int:
        trainer = make_trainer(make_config(local={"update_threads": update_threads}))
        executor = update_executor(trainer, engine)
        try:
            return executor.submit(torch.get_num_threads).result()
        finally:
            executor.shutdown()
            trainer.close()

    assert threads_of(2, SimpleNamespace(cpu_threads=1)) == 1
    assert threads_of(1, SimpleNamespace(cpu_threads=1)) == max(1, callers - 1)
    assert threads_of(1, SimpleNamespace(cpu_threads=callers + 4)) == 1
    assert threads_of(1, SimpleNamespace()) == callers  # an engine that computes elsewhere
    assert torch.get_num_threads() == callers
    default = make_trainer(make_config())
    assert (default.threads.size if default.threads else 1) == callers  # torch's count by default
    default.close()
