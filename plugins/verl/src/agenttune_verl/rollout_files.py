"""The rollout log, written by many verl worker processes at once.

verl runs agent loops in several worker processes (possibly on several nodes sharing the run
directory); each appends its episodes to `<run_dir>/rollouts/step_NNNNNN_<split>.jsonl`. An exclusive
`flock` around each append keeps records from interleaving.
"""

from __future__ import annotations

import fcntl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agenttune.plugin_api import Episode, RolloutLog


class LockedRolloutLog(RolloutLog):
    def write(self, step: int, split: str, episodes: Sequence[Episode], tokenizer: Any) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        with (self.dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return super().write(step, split, episodes, tokenizer)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
