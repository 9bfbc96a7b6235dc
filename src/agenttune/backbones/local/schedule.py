"""Learning-rate schedules: linear warm-up, then constant, cosine or linear decay to zero."""

from __future__ import annotations

import math
from collections.abc import Callable


def lr_factor(kind: str, *, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at a given (0-based) training step."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        decay_steps = max(total_steps - warmup_steps, 1)
        progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if kind == "linear":
            return 1.0 - progress
        raise ValueError(f"unknown learning-rate schedule {kind!r}")

    return factor
