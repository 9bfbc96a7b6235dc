"""The end-of-run report: a PNG of the training curves and a summary table (`agenttune report RUN_DIR`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agenttune.errors import UserError
from agenttune.rollout.metrics import MetricsLog

PLOT_NAME = "training_curves.png"

# (title, [(metric, label)]): one panel each; panels whose metrics never appear are left out.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("Reward", [("reward/mean", "train"), ("val/reward/mean", "validation")]),
    ("Success rate / accuracy", [("success_rate", "train"), ("val/success_rate", "validation")]),
    ("Response length (tokens)", [("train/response_length_mean", "trained sample"),
                                  ("tokens/generated_mean", "generated per episode")]),
    ("KL to reference", [("train/kl", "KL")]),
    ("Entropy", [("train/entropy", "policy entropy")]),
    ("Sampling vs training log-probs", [("train/logprob_mismatch", "mean |diff|")]),
]

SUMMARY: list[tuple[str, str, str]] = [  # metric, label, format
    ("val/success_rate", "validation accuracy", "{:.1%}"),
    ("val/reward/mean", "validation reward", "{:.3f}"),
    ("success_rate", "train success rate", "{:.1%}"),
    ("reward/mean", "train reward", "{:.3f}"),
    ("train/response_length_mean", "response length", "{:.1f}"),
    ("train/entropy", "entropy", "{:.3f}"),
    ("train/kl", "KL", "{:.4f}"),
    ("groups/zero_variance_frac", "zero-variance groups", "{:.0%}"),
    ("perf/tokens_per_s", "tokens/s (step)", "{:,.0f}"),
]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise UserError(f"{str(run_dir)!r} has no metrics.jsonl.",
                        hint="Point `agenttune report` at a run directory of a training run.")
    return MetricsLog(path).read()


def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(record["step"], record[key]) for record in records if record.get(key) is not None]
    return [step for step, _ in points], [value for _, value in points]


def plot_curves(records: list[dict[str, Any]], path: Path, *, title: str = "") -> Path | None:
    """Draw every panel that has data; None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in threads and on servers
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [(name, lines) for name, lines in PANELS if any(series(records, key)[0] for key, _ in lines)]
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    for axis, (name, lines) in zip(axes.flat, panels, strict=False):
        for key, label in lines:
            steps, values = series(records, key)
            if steps:
                axis.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
        axis.set_title(name)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        if len(lines) > 1:
            axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def summary_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="run summary")
    for column in ("metric", "first", "last", "best", "steps"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for key, label, fmt in SUMMARY:
        steps, values = series(records, key)
        if not steps:
            continue
        best = min(values) if key in ("train/kl",) else max(values)
        table.add_row(label, f"{fmt.format(values[0])} (step {steps[0]})", f"{fmt.format(values[-1])} (step {steps[-1]})",
                      fmt.format(best), str(len(steps)))
    return table


def report(run_dir: Path, *, console: Console | None = None, plot: bool = True) -> Path | None:
    """Print the summary table and (re)draw the curves into `<run_dir>/training_curves.png`."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    console = console or Console()
    if not records:
        console.print(f"{run_dir}: no steps recorded yet.")
        return None
    console.print(summary_table(records))
    if not plot:
        return None
    path = plot_curves(records, run_dir / PLOT_NAME, title=run_dir.name)
    if path is not None:
        console.print(f"curves: {path}")
    return path
