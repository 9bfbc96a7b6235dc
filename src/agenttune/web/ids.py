"""Ids for completions and tool calls: unique, not secret (episode keys come from `secrets`).

A private generator, seeded from the OS: a workflow's `random.seed()` cannot make ids repeat, and
it costs no system call per id (the gateway makes two per call).
"""

from __future__ import annotations

import os
import random

_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)  # a forked worker must not repeat its parent's ids


def random_id(prefix: str) -> str:
    """`prefix` + 24 hex digits (96 random bits)."""
    return f"{prefix}{_random.getrandbits(96):024x}"
