"""`agenttune train`: resolve the config, check every component, prepare the run, hand over."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("train", context_settings={"allow_extra_args": False})(train)


def train(
    conf: Path = typer.Option(..., "--conf", help="The YAML config file."),
    backbone: str = typer.Option(None, "--backbone", help="debug, local, verl, trinity, ... (default: config's)."),
    agent: str = typer.Option(None, "--agent", help="Agent framework (default: config's agent_framework)."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Run directory (default runs/<project>/<experiment>/<time>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint in the run directory."),
    with_logview: bool = typer.Option(False, "--with-logview", help="Serve the log viewer on the run directory "
                                      "while training (and after, until Ctrl-C); prints its URL."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
) -> None:
    """Train (or, with --backbone debug, just roll out and judge) the configured workflow."""
    from agenttune.entrypoints.train import train_from_config
    from agenttune.registry.config_loading import load_config

    config = load_config(conf, overrides or [], backbone=backbone, agent_framework=agent)
    if with_logview:
        from agenttune.entrypoints.train_with_logview import train_with_logview

        return train_with_logview(config, run_dir=run_dir, resume=resume)
    train_from_config(config, run_dir=run_dir, resume=resume)
