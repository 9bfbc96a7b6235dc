"""CLI commands for runs of the local backbone: `agenttune export` and `agenttune report`.

Only typer is imported here; the work happens in functions that import torch when they run.
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("export")(export)
    app.command("report")(report)


def export(
    run_dir: Path = typer.Argument(..., help="The run directory (with checkpoints/)."),
    out: Path = typer.Option(..., "--out", help="Where to write the Hugging Face model."),
    step: int = typer.Option(None, "--step", help="Export this step's checkpoint (default: the latest)."),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty --out directory."),
    policy: str = typer.Option(None, "--policy", help="A run with several policies: the one to export."),
) -> None:
    """Write a checkpoint as a standalone Hugging Face model (LoRA merged) that transformers loads directly."""
    from agenttune.backbones.local.export import export_model

    written = export_model(run_dir, out, step=step, force=force, policy=policy)
    typer.echo(f"Exported to {written}")


def report(
    run_dir: Path = typer.Argument(..., help="The run directory (with metrics.jsonl)."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Also (re)draw training_curves.png."),
) -> None:
    """Print a run's summary table and draw its training curves into RUN_DIR/training_curves.png."""
    from agenttune.backbones.local.report import report as make_report

    make_report(run_dir, plot=plot)
