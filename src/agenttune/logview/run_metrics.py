"""The curves of a run: reward, success and validation accuracy over steps, from `metrics.jsonl`.

The file grows while training runs; a line still being written (no newline yet) is left for the
next poll, and a line that is not JSON is skipped rather than failing the chart.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agenttune.logview.catalog import MAX_METRICS_BYTES, read_regular_file

# (title, whether values are fractions, [(metric name, label)]). Names as agenttune.rollout.metrics writes them.
CHARTS: list[tuple[str, bool, list[tuple[str, str]]]] = [
    ("Reward", False, [("reward/mean", "train reward"), ("val/reward/mean", "validation reward")]),
    ("Success / accuracy", True, [("success_rate", "train success"), ("val/success_rate", "validation accuracy")]),
]


@dataclass
class MetricsReader:
    """Reads `metrics.jsonl` files, re-reading one only when it changed."""

    _cache: dict[Path, tuple[tuple[int, int], list[dict[str, Any]]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def records(self, path: Path) -> list[dict[str, Any]]:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return []
        version = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._cache.get(path)
            if cached and cached[0] == version:
                return cached[1]
        data = read_regular_file(path, MAX_METRICS_BYTES)
        records = parse_metrics(data) if data is not None else []
        with self._lock:
            self._cache[path] = (version, records)
        return records


def parse_metrics(data: bytes) -> list[dict[str, Any]]:
    complete = data[: data.rfind(b"\n") + 1]
    records = []
    for line in complete.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int | float):
            records.append(record)
    return records


def charts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The charts of a run, each series a list of `[step, value]` (steps without the metric left out)."""
    return [
        {"title": title, "fraction": fraction,
         "series": [{"key": key, "label": label, "points": _points(records, key)} for key, label in series]}
        for title, fraction, series in CHARTS
    ]


def _points(records: list[dict[str, Any]], key: str) -> list[list[float]]:
    points = {}
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            points[record["step"]] = value  # a step written twice (a resumed run): the last one counts
    return [[step, value] for step, value in sorted(points.items())]
