"""Where step metrics go besides metrics.jsonl: TensorBoard, Weights & Biases, SwanLab.

TensorBoard is on by default (`monitor.tensorboard`). W&B and SwanLab are used when switched on in
`monitor:` and installed; switched on but missing is a clear error before training starts.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from agenttune.config.models import AgentTuneConfig
from agenttune.config.run import Run, get_logger
from agenttune.errors import UserError

log = get_logger("local.monitor")


def check_trackers(config: AgentTuneConfig) -> None:
    for name, enabled in (("wandb", config.monitor.wandb), ("swanlab", config.monitor.swanlab)):
        if enabled and importlib.util.find_spec(name) is None:
            raise UserError(f"monitor.{name} is on but the {name!r} package is not installed.",
                            hint=f"pip install {name}, or set monitor.{name}: false.")


class Trackers:
    """Fan one step's metrics out to every configured tracker."""

    def __init__(self, run: Run):
        self.sinks: list[Any] = []
        config = run.config
        if config.monitor.tensorboard:
            self.sinks.append(_TensorBoard(run))
        if config.monitor.wandb:
            self.sinks.append(_Wandb(run))
        if config.monitor.swanlab:
            self.sinks.append(_SwanLab(run))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        numbers = {key: float(value) for key, value in metrics.items()
                   if isinstance(value, int | float) and not isinstance(value, bool)}
        for sink in self.sinks:
            try:
                sink.log(step, numbers)
            except Exception as error:  # a tracker hiccup (network, disk) must not stop training
                log.warning("tracker failed", tracker=type(sink).__name__, error=str(error))

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as error:
                log.warning("tracker failed to close", tracker=type(sink).__name__, error=str(error))


class _TensorBoard:
    def __init__(self, run: Run):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run.run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, run: Run):
        import wandb

        config = run.config
        self.run = wandb.init(project=config.project_name, name=f"{config.experiment_name}/{run.run_dir.name}",
                              dir=str(run.run_dir), config=config.model_dump(mode="json"),
                              resume="allow", id=_run_id(run))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class _SwanLab:
    def __init__(self, run: Run):
        import swanlab

        config = run.config
        self.swanlab = swanlab
        swanlab.init(project=config.project_name, experiment_name=config.experiment_name,
                     logdir=str(run.run_dir / "swanlab"), config=config.model_dump(mode="json"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.swanlab.log(metrics, step=step)

    def close(self) -> None:
        self.swanlab.finish()


def _run_id(run: Run) -> str:
    """A stable id per run directory, so a resumed run continues the same W&B run."""
    import hashlib

    return hashlib.sha256(str(run.run_dir.resolve()).encode()).hexdigest()[:16]
