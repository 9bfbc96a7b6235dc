"""`agenttune plugins list`."""

from __future__ import annotations

import json

import typer

app = typer.Typer(help="Inspect installed plugins.", no_args_is_help=True)


@app.command("list")
def list_plugins(as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table.")) -> None:
    """List installed plugins, what each provides, and any that failed to load."""
    from agenttune.plugins import KINDS, get_plugin_manager

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
        table.add_row(info.name, info.version, info.distribution, provides)
    Console().print(table)


def _plural(label: str) -> str:
    return label + ("es" if label.endswith("s") else "s")
