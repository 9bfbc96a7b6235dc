"""The `agenttune` command line.

Keep this module's imports light: `agenttune --help` must not import torch, transformers, verl or
any agent framework. Sub-commands import what they need when they run.
"""

from __future__ import annotations

import os
import sys

import typer

from agenttune.cli import config_cmd, plugins_cmd, train_cmd
from agenttune.errors import UserError

app = typer.Typer(
    name="agenttune",
    help="Train the LLM agent you already have with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(plugins_cmd.app, name="plugins")
app.add_typer(config_cmd.app, name="config")
train_cmd.register(app)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
) -> None:
    if debug:
        os.environ["AGENTTUNE_DEBUG"] = "1"


def _register_plugin_commands() -> None:
    from agenttune.plugins import get_plugin_manager

    # Only plugins that implement register_commands are asked; discovery itself is cheap.
    get_plugin_manager().register_commands(app)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in args:
        os.environ["AGENTTUNE_DEBUG"] = "1"
    try:
        _register_plugin_commands()
        app(args=args, prog_name="agenttune", standalone_mode=False)
    except UserError as error:
        if os.environ.get("AGENTTUNE_DEBUG"):
            raise
        from rich.console import Console

        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]Error:[/] {error.render()}")
        raise SystemExit(error.exit_code) from None
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as error:
        import click

        if isinstance(error, click.exceptions.Abort):
            raise SystemExit(130) from None
        if isinstance(error, click.ClickException):
            error.show()
            raise SystemExit(error.exit_code) from None
        if isinstance(error, click.exceptions.Exit):
            raise SystemExit(error.exit_code) from None
        raise


if __name__ == "__main__":
    main()
