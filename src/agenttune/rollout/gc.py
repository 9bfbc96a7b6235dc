"""The garbage collector's settings while a batch of episodes runs.

Rollouts allocate fast (requests, messages, token-id lists) while every episode shares one event
loop, so collection pauses stall every episode at once. Two well-known settings take most of that
cost away, for the duration of a batch only:

- `gc.freeze()`: a training process holds hundreds of thousands of long-lived objects (torch,
  transformers, the tokenizer, the model's modules). Full collections walk all of them; frozen
  ones are skipped. `gc.unfreeze()` after the batch hands them back, so cyclic garbage among them
  is still collected later and nothing leaks (frozen objects are freed by reference counting as
  usual).
- A larger young-generation threshold: with a hundred episodes in flight, each small collection
  walks the token-id lists of every call still running; collecting every 50,000 allocations
  instead of every 700 walks them far less often. Cyclic garbage waits a little longer (well under
  a second in a busy rollout).

Batches may overlap (validation beside training, several event loops): the settings hold while
any of them runs. A heap that is already frozen (some inference servers freeze theirs) and
thresholds the program changed in the meantime are left as they are.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 50_000

_lock = threading.Lock()
_holders = 0
_froze = False
_thresholds: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None  # (before, ours)


@contextmanager
def rollout_gc() -> Iterator[None]:
    """Freeze the existing heap and collect young objects less often inside the block."""
    _enter()
    try:
        yield
    finally:
        _exit()


def _enter() -> None:
    global _holders, _froze, _thresholds
    with _lock:
        _holders += 1
        if _holders > 1 or not gc.isenabled():
            return
        if gc.get_freeze_count() == 0:
            gc.freeze()
            _froze = True
        before = gc.get_threshold()
        if 0 < before[0] < YOUNG_THRESHOLD:
            ours = (YOUNG_THRESHOLD, *before[1:])
            gc.set_threshold(*ours)
            _thresholds = (before, ours)


def _exit() -> None:
    global _holders, _froze, _thresholds
    with _lock:
        _holders -= 1
        if _holders:
            return
        if _froze:
            gc.unfreeze()
            _froze = False
        if _thresholds is not None:
            before, ours = _thresholds
            if gc.get_threshold() == ours:
                gc.set_threshold(*before)
            _thresholds = None
