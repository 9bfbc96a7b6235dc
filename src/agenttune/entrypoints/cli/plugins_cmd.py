"""`agenttune plugins list` and `agenttune plugins new`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(help="Inspect installed plugins.", no_args_is_help=True)


@app.command("list")
def list_plugins(as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table.")) -> None:
    """List installed plugins, what each provides, and any that failed to load."""
    from agenttune.registry.manager import KINDS, get_plugin_manager

    infos = get_plugin_manager().infos()
    if as_json:
        typer.echo(json.dumps([info.as_json() for info in infos], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="agenttune plugins")
    for column in ("name", "version", "distribution", "provides"):
        table.add_column(column)
    for info in infos:
        provides = "; ".join(f"{_plural(KINDS[kind][1])}: {', '.join(names)}"
                             for kind, names in info.provides.items() if names)
        if info.config_sections:
            provides += ("; " if provides else "") + f"config sections: {', '.join(info.config_sections)}"
        if info.problem:
            provides = f"[red]BROKEN: {info.problem}[/]" + (f" ({provides})" if provides else "")
        for deprecation in info.deprecations:
            provides += f"\n[yellow]DEPRECATED IMPORT: {deprecation}[/]"
        table.add_row(info.name, info.version, info.distribution, provides)
    Console().print(table)


def _plural(label: str) -> str:
    return label + ("es" if label.endswith("s") else "s")


@app.command("new")
def new_plugin(
    name: str = typer.Argument(help="The plugin's name (`my-env` or `my_env`): its distribution is agenttune-plugin-my-env, its package agenttune_my_env, its components are named my_env."),
    kinds: list[str] = typer.Option(["reader", "judge"], "--kind", "-k",
                                    help="What it provides (repeat the option): reader, judge, framework, "
                                         "backbone, engine, parser."),
    directory: Path | None = typer.Option(None, "--directory", "-d",
                                          help="Where to write it (default: ./agenttune-plugin-NAME)."),
) -> None:
    """Write a working plugin package: pyproject.toml with its entry point, a module per kind, tests, debug.yaml."""
    from agenttune.entrypoints.cli.plugin_template import distribution, write_plugin

    target = directory or Path(distribution(name))
    written = write_plugin(name, kinds, target)
    typer.echo(f"Wrote {len(written)} files to {target}/. Next:\n"
               f"  cd {target}\n"
               f"  pip install -e '.[test]'      # (CPU: pip install torch==2.13.0 first)\n"
               f"  pytest\n"
               f"  agenttune train --conf debug.yaml --backbone debug")
