"""The training progress bar: step, epoch, reward, success rate, tokens/s and time left."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TrainingProgress:
    """A rich progress bar over the run's steps; `phase` says what the current step is doing."""

    def __init__(self, total_steps: int, *, start_step: int = 0, label: str = "step",
                 console: Console | None = None):
        self.progress = Progress(
            TextColumn(f"[bold]{label}"),
            MofNCompleteColumn(),
            BarColumn(bar_width=24),
            TextColumn("epoch {task.fields[epoch]}"),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("success {task.fields[success]}"),
            TextColumn("val {task.fields[val]}"),
            TextColumn("{task.fields[tokens_per_s]} tok/s"),
            TextColumn("[dim]{task.fields[phase]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(
            "train", total=total_steps, completed=start_step, epoch=0, reward="-", success="-", val="-",
            tokens_per_s="-", phase="starting",
        )

    def __enter__(self) -> TrainingProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.progress.stop()

    def phase(self, text: str) -> None:
        self.progress.update(self.task, phase=text)

    def step_done(self, step: int, epoch: int, metrics: dict[str, float]) -> None:
        fields: dict[str, Any] = {"epoch": epoch, "phase": ""}
        if "reward/mean" in metrics:
            fields["reward"] = f"{metrics['reward/mean']:.3f}"
        if "success_rate" in metrics:
            fields["success"] = f"{metrics['success_rate']:.0%}"
        if "val/success_rate" in metrics:
            fields["val"] = f"{metrics['val/success_rate']:.0%}"
        if "perf/tokens_per_s" in metrics:
            fields["tokens_per_s"] = f"{metrics['perf/tokens_per_s']:,.0f}"
        self.progress.update(self.task, completed=step, **fields)

    def warmup_step(self, step: int, metrics: dict[str, float]) -> None:
        self.progress.update(self.task, completed=step, phase=f"loss {metrics.get('warmup/loss', 0.0):.3f}",
                             tokens_per_s=f"{metrics.get('warmup/tokens_per_s', 0.0):,.0f}")

    def validation_done(self, metrics: dict[str, float]) -> None:
        if "val/success_rate" in metrics:
            self.progress.update(self.task, val=f"{metrics['val/success_rate']:.0%}")

    def print(self, *objects) -> None:
        self.progress.console.print(*objects)
