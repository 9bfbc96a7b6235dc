"""A Trinity monitor that writes agenttune's `<run_dir>/metrics.jsonl`, then hands on to Trinity's own.

Trinity logs through one monitor class at a time (`monitor.monitor_type`); the trinity backbone sets
this one, which appends every step's metrics to the run's metrics.jsonl — the file agenttune's report
and log viewer read — and passes them to every monitor the agenttune config asked for
(`monitor_args.inner`: a list of tensorboard, wandb and swanlab, or one name; their files stay under
Trinity's checkpoint directory). Trinity's explorer and trainer each log their own step, so a step can
have two lines: the names tell them apart
(`rollout/...`, `eval/...` from the explorer; `actor/...`, `critic/...` from the trainer).
"""

from __future__ import annotations

import numbers
from typing import Any

from trinity.utils.monitor import MONITOR, Monitor

from agenttune.plugin_api import MetricsLog


class AgentTuneMonitor(Monitor):
    def __init__(self, project: str, group: str, name: str, role: str, config: Any = None) -> None:
        super().__init__(project=project, name=name, role=role, config=config)
        args = (config.monitor.monitor_args if config is not None else None) or {}
        self.metrics_log = MetricsLog(args["metrics_file"]) if args.get("metrics_file") else None
        inner = args.get("inner") or []
        names = [inner] if isinstance(inner, str) else list(inner)  # one name, or every monitor enabled
        self.inner: list[Monitor] = [
            MONITOR.get(monitor)(project=project, group=group, name=name, role=role, config=config)
            for monitor in names
        ]

    def log(self, data: dict, step: int, commit: bool = False) -> None:
        if self.metrics_log is not None:
            numbers_only = {key: scalar for key, value in data.items() if (scalar := _scalar(value)) is not None}
            # Trinity's Tinker trainer also reports a "step" of its own that restarts at 1 after a resume;
            # the step Trinity logs at is the run's
            numbers_only.pop("step", None)
            if numbers_only:
                self.metrics_log.write(step, numbers_only)
        for monitor in self.inner:
            monitor.log(data, step, commit)

    def log_table(self, table_name: str, experiences_table: Any, step: int) -> None:
        for monitor in self.inner:
            monitor.log_table(table_name, experiences_table, step)

    def close(self) -> None:
        inner, self.inner = getattr(self, "inner", []), []
        for monitor in inner:
            monitor.close()

    @classmethod
    def default_args(cls) -> dict:
        return {"metrics_file": None, "inner": ["tensorboard"]}


def _scalar(value: Any) -> float | None:
    """A plain number for JSON: Python, numpy and 0-d torch numbers; None for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):  # (a complex number has no float)
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return float(item())
    return None
