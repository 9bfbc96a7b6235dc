"""The `agenttune` command line.

Keep this module's imports light: `agenttune --help` must not import torch, transformers, verl or
any agent framework. Sub-commands import what they need when they run.

Every `UserError` ends the command with one paragraph on stderr and exit code 2; `--debug` shows
the traceback instead.
"""

from __future__ import annotations

import sys
import warnings

import typer

from agenttune.backbones.local import commands as local_commands
from agenttune.entrypoints.cli import (
    config_cmd,
    data_cmd,
    logview_cmd,
    model_cmd,
    plugins_cmd,
    serve_cmd,
    tinker_cmd,
    train_cmd,
)
from agenttune.errors import PluginWarning, UserError

app = typer.Typer(
    name="agenttune",
    help="Train the LLM agent you already have with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(plugins_cmd.app, name="plugins")
app.add_typer(config_cmd.app, name="config")
app.add_typer(data_cmd.app, name="data")
app.add_typer(model_cmd.app, name="model")
app.add_typer(tinker_cmd.app, name="tinker")
train_cmd.register(app)
local_commands.register(app)  # export, report
logview_cmd.register(app)
serve_cmd.register(app)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
) -> None:
    pass  # `main` reads --debug itself: errors raised before the callback runs need it too


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    with warnings.catch_warnings():
        warnings.showwarning = _show_plugin_warnings(warnings.showwarning)
        try:
            _run(args)
        except UserError as error:
            if debug:
                raise
            _print_error(error.render())
            raise SystemExit(error.exit_code) from None


def _run(args: list[str]) -> None:
    from agenttune.registry.manager import get_plugin_manager

    get_plugin_manager().register_commands(app)
    # Standalone mode: usage errors, --help and Ctrl-C are handled (and exit) the usual way; a
    # UserError passes through to `main`. Success returns normally, for callers of main().
    try:
        app(args=args, prog_name="agenttune", standalone_mode=True)
    except SystemExit as exit:
        if exit.code not in (0, None):
            raise


def _print_error(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]Error:[/] {escape(message)}")


def _show_plugin_warnings(default):
    """Plugin warnings as one line each ("Warning: ..."), without Python's source-line noise."""

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PluginWarning):
            print(f"Warning: {message}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


if __name__ == "__main__":
    main()
