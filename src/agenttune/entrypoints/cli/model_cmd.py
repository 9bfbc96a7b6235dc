"""`agenttune model ...`: helpers for the model under training."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Model helpers (build a tiny test model, ...).", no_args_is_help=True)


@app.command("init-tiny")
def init_tiny(
    directory: Path = typer.Argument(..., help="Where to write the model (created if missing)."),
    name: str = typer.Option("default", "--name", help="Seeds the random weights; same name, same model."),
    layers: int = typer.Option(4, "--layers", min=1, help="Transformer layers."),
    hidden: int = typer.Option(128, "--hidden", min=8, help="Hidden size."),
) -> None:
    """Write a tiny random Qwen2-architecture model with a tools-capable chat template to DIRECTORY.

    It loads with AutoModelForCausalLM/AutoTokenizer like any model; use it for tests and CPU
    debugging runs (`model.path: DIRECTORY`, or `model.path: tiny://default` to build it on demand).
    """
    from agenttune.components.engines.tiny_model import TinySpec, build_tiny_model
    from agenttune.errors import UserError

    if directory.exists() and any(directory.iterdir()):
        raise UserError(f"{str(directory)!r} exists and is not empty.", hint="Pick a new or empty directory.")
    written = build_tiny_model(directory, TinySpec(name=name, layers=layers, hidden=hidden))
    typer.echo(f"Wrote a tiny model to {written}")
