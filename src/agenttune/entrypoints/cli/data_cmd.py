"""`agenttune data download` and `agenttune data preview`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(help="Download datasets and preview the tasks a config reads.", no_args_is_help=True)

CELL_CHARS = 300  # longer cells are cut in preview tables


@app.command("download")
def download(
    dataset: str = typer.Argument(..., help="Hugging Face dataset name (openai/gsm8k) or a local dataset directory."),
    path: Path = typer.Option(..., "--path", help="Directory to save into (as DIR/<dataset>/<subset>/<split>-*.parquet)."),
    name: str = typer.Option(None, "--name", "--subset", help="Only this subset (default: every subset)."),
    rows: int = typer.Option(2, "-n", "--rows", min=0, help="Rows to show from the first split."),
) -> None:
    """Fetch a dataset with `datasets` and save every split of every subset as Parquet."""
    from rich.console import Console

    from agenttune.components.readers.hub_download import download_dataset

    console = Console()
    saved = download_dataset(dataset, path, subset=name)
    table = _table("downloaded files", ["#", "file", "rows"])
    for index, item in enumerate(saved):
        table.add_row(str(index), str(item.file), str(item.rows))
    console.print(table)
    if rows and saved:
        first = next((item for item in saved if item.split == "train"), saved[0])
        console.print(_rows_table(f"{first.subset}/{first.split}", first.preview(rows)))


@app.command("preview")
def preview(
    conf: Path = typer.Option(..., "--conf", help="The YAML config file."),
    split: str = typer.Option(None, "--split", help="Split to read (default: task_reader.train_split)."),
    count: int = typer.Option(5, "-n", "--count", min=1, help="How many tasks to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the tasks as JSON lines instead of a table."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
) -> None:
    """Show the first tasks exactly as the configured task reader produces them."""
    from agenttune.components.readers.deadline import read_tasks
    from agenttune.registry.config_loading import load_config
    from agenttune.registry.resolution import resolve_task_reader

    config = load_config(conf, overrides or [])
    reader = resolve_task_reader(config)
    split = split or config.task_reader.train_split
    tasks = list(read_tasks(reader, split, timeout=config.task_reader.read_timeout, limit=count))
    if as_json:
        for task in tasks:
            typer.echo(task.model_dump_json())
        return
    from rich.console import Console

    table = _table(f"{config.task_reader.type} reader, split {split!r}: first {len(tasks)} tasks",
                   ["task_id", "query", "ground truth", "other metadata"])
    for task in tasks:
        others = {key: value for key, value in task.metadata.items() if key != "ground_truth"}
        if task.init_messages:
            others["init_messages"] = f"{len(task.init_messages)} messages"
        table.add_row(task.task_id, _cell(task.query), _cell(task.ground_truth), _cell(others))
    Console().print(table)


def _rows_table(title: str, rows: list[dict[str, Any]]) -> Any:
    columns = list(rows[0]) if rows else []
    table = _table(title, ["", *columns])
    for index, row in enumerate(rows):
        table.add_row(f"[{index}]", *(_cell(row[column]) for column in columns))
    return table


def _table(title: str, columns: list[str]) -> Any:
    from rich.table import Table

    table = Table(title=title, show_lines=True)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _cell(value: Any) -> str:
    from rich.markup import escape

    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > CELL_CHARS:
        text = text[: CELL_CHARS - 3] + "..."
    return escape(text)
