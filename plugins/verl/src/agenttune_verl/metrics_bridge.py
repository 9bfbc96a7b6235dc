"""verl's per-step metrics plus the step's episodes, written as agenttune's `<run_dir>/metrics.jsonl`.

verl's "file" logger writes `{"step": N, "data": {name: value}}` lines to `<run_dir>/verl/metrics.jsonl`
(`VERL_FILE_LOGGER_PATH`). For each such line the bridge writes one agenttune step: verl's numbers
under `verl/...`, and agenttune's own step metrics (reward, success rate, merge breaks, truncation...)
computed from the episodes the agent loops logged for that step, so curves compare with the other
backbones. `MetricsFollower` does this while verl runs, in a thread.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from agenttune.plugin_api import Episode, MetricsLog, RolloutLog, get_logger, read_records, step_metrics
from agenttune_verl.outputs import FAILED_EPISODE_DROPPED, OVERLONG_PENALTY

log = get_logger("verl.metrics")

TRUNCATION_PREFIX = "truncation/"
FAILED_EPISODES_SKIPPED = "train/failed_episodes_skipped"
OVERLONG_PENALTY_SUM = "train/overlong_penalty"  # the local backbone's name: the step's penalties, summed
VALIDATION = "validation"


def bridge_step(verl_line: dict[str, Any], rollout_log: RolloutLog) -> tuple[int, dict[str, float]]:
    """One agenttune metrics step from one line of verl's metrics file."""
    step = int(verl_line["step"])
    metrics = {f"verl/{name}": float(value) for name, value in (verl_line.get("data") or {}).items()
               if _is_number(value)}
    for split, prefix in (("train", ""), (VALIDATION, "val/")):
        episodes = _episodes(rollout_log, step, split)
        if episodes:
            metrics.update(step_metrics(episodes, prefix=prefix))
            metrics.update(truncation_metrics(episodes, prefix=prefix))
            if split == "train":
                metrics[FAILED_EPISODES_SKIPPED] = failed_episodes_dropped(episodes)
                if any(OVERLONG_PENALTY in episode.metrics for episode in episodes):
                    metrics[OVERLONG_PENALTY_SUM] = sum(episode.metrics.get(OVERLONG_PENALTY, 0.0)
                                                        for episode in episodes)
    return step, metrics


def failed_episodes_dropped(episodes: list[Episode]) -> float:
    """How many failed episodes the agent loops left out of training (the local backbone's metric name)."""
    return sum(episode.metrics.get(FAILED_EPISODE_DROPPED, 0.0) for episode in episodes)


def truncation_metrics(episodes: list[Episode], *, prefix: str = "") -> dict[str, float]:
    """Sums of the agent loop's `truncation/...` counters (tokens cut to fit verl's length limits)."""
    totals: dict[str, float] = {}
    for episode in episodes:
        for name, value in episode.metrics.items():
            if name.startswith(TRUNCATION_PREFIX):
                totals[f"{prefix}{name}"] = totals.get(f"{prefix}{name}", 0.0) + value
    return totals


def _episodes(rollout_log: RolloutLog, step: int, split: str) -> list[Episode]:
    path = rollout_log.path(step, split)
    return list(read_records(path)) if path.exists() else []


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class MetricsFollower:
    """Tails verl's metrics file in a thread and writes each new step to the run's metrics.jsonl."""

    def __init__(self, verl_metrics: Path, rollout_log: RolloutLog, metrics_log: MetricsLog, *,
                 poll_s: float = 1.0):
        self.verl_metrics = verl_metrics
        self.rollout_log = rollout_log
        self.metrics_log = metrics_log
        self.poll_s = poll_s
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="agenttune-verl-metrics", daemon=True)

    def __enter__(self) -> MetricsFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # whatever verl wrote last

    def poll(self) -> int:
        """Bridge every complete line written since the last poll; returns how many."""
        if not self.verl_metrics.exists():
            return 0
        with self.verl_metrics.open("rb") as file:
            file.seek(self._offset)
            data = file.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self._offset += len(complete)
        lines = [line for line in complete.decode("utf-8").splitlines() if line.strip()]
        for line in lines:
            try:
                step, metrics = bridge_step(json.loads(line), self.rollout_log)
            except (ValueError, KeyError, TypeError) as error:  # one odd line must not stop the rest
                log.warning("skipped a line of verl's metrics", error=f"{type(error).__name__}: {error}")
                continue
            self.metrics_log.write(step, metrics)
        return len(lines)

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except OSError as error:  # e.g. the file system hiccups; try again on the next tick
                log.warning("reading verl's metrics failed", error=f"{type(error).__name__}: {error}")
