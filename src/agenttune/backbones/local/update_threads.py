"""On CPU, an update's micro-batches run on several threads at once, one intra-op thread each.

torch parallelises each op over an OpenMP team, and every op ends at the team's barrier: when the
engine's decode thread or the event loop (the agents, the gateway) preempts one of its threads, the
others wait for it, op after op. In an asynchronous step they always do, and a two-thread update was
slower than a one-thread one (issue 39). Threads that each run whole micro-batches on one core never
wait for each other: a preempted one only delays its own micro-batch while the others take the next
ones. `python bench/update_threads.py` measures both side by side, alone and beside a busy thread.

Each micro-batch's gradients come from `torch.autograd.grad` and are added into `.grad` in micro-batch
order, as `backward()` one micro-batch after the other adds them: the same sums in the same order,
whichever thread finishes first. Off CPU (one stream of kernels) the update runs as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from agenttune.backbones.local.options import local_options
from agenttune.components.engines.hf import intra_op_executor

Item = TypeVar("Item")
Result = TypeVar("Result")

# Micro-batches per thread, at least: a thread that is preempted leaves its later micro-batches to the
# others (two threads on the bench's step: 8 micro-batches 1.7-2.0 s, 4 micro-batches 2.1 s).
MICRO_BATCHES_PER_THREAD = 4


def update_threads(config: Any, device: torch.device) -> int:
    """How many micro-batches an update computes at once: `local.update_threads`, else torch's thread
    count, on CPU; one elsewhere."""
    if device.type != "cpu":
        return 1
    return local_options(config).update_threads or torch.get_num_threads()


class UpdateThreads:
    """`size` threads with one intra-op thread each, running a function over micro-batches."""

    def __init__(self, size: int):
        self.size = size
        self._executor = intra_op_executor("agenttune-update-worker", 1, workers=size)

    def map(self, function: Callable[[Item], Result], items: Iterable[Item]) -> Iterator[Result]:
        """`function` of each item, in the items' order; at most `size` + 1 results wait to be taken (each
        may hold a whole set of gradients)."""
        running: deque[Future[Result]] = deque()
        try:
            for item in items:
                running.append(self._executor.submit(function, item))
                if len(running) > self.size:
                    yield running.popleft().result()
            while running:
                yield running.popleft().result()
        finally:  # a micro-batch failed, or the caller stopped early: the rest are not needed
            for future in running:
                future.cancel()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def accumulate(parameters: list[torch.nn.Parameter], gradients: Iterable[torch.Tensor | None]) -> None:
    """Add one micro-batch's gradients into `.grad`, as `backward()` would (the first one is kept as is)."""
    for parameter, gradient in zip(parameters, gradients, strict=True):
        if gradient is None:
            continue
        if parameter.grad is None:
            parameter.grad = gradient
        else:
            parameter.grad.add_(gradient)
