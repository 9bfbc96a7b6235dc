"""`agenttune config show`, `config schema` and `config docs`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(help="Show the resolved configuration, its JSON schema or its reference.", no_args_is_help=True)


@app.command("show")
def show(
    conf: Path = typer.Option(None, "--conf", help="The YAML config file."),
    backbone: str = typer.Option(None, "--backbone", help="Also print this backbone's generated native config."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
) -> None:
    """Print the fully resolved configuration as YAML, once every reference in it resolves (`config check`)."""
    import yaml

    from agenttune.registry.config_loading import load_config
    from agenttune.registry.manager import get_component
    from agenttune.registry.resolution import preflight

    config = load_config(conf, overrides or [], backbone=backbone)
    if conf is not None:  # with no file, the defaults are shown, which name no workflow yet
        preflight(config)
    typer.echo(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), nl=False)
    if backbone:
        native = get_component("backbones", backbone, key="--backbone").native_config(config)
        if native is not None:
            typer.echo(f"# --- generated {backbone} config ---")
            typer.echo(yaml.safe_dump(native, sort_keys=False), nl=False)


@app.command("check")
def check(
    conf: Path = typer.Option(..., "--conf", help="The YAML config file."),
    backbone: str = typer.Option(None, "--backbone", help="Check for this backbone (default: the config's)."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
) -> None:
    """Resolve everything a run of this config needs, without starting it; exit 2 with train's message if not.

    Component types, code references (workflow, judge), data files and splits, the engine's options,
    and the model directory's config and tokenizer (not its weights).
    """
    from agenttune.registry.config_loading import load_config
    from agenttune.registry.resolution import preflight

    config = load_config(conf, overrides or [], backbone=backbone)
    preflight(config)
    typer.echo(f"{conf}: ok (backbone {config.backbone}, workflow {config.workflow}, judge "
               f"{config.judge.type or config.judge.judge_protocol or 'none: the workflow rewards'})")


@app.command("schema")
def schema() -> None:
    """Print the JSON schema of the configuration (point your editor's YAML support at it)."""
    from agenttune.registry.config_loading import config_model

    typer.echo(json.dumps(config_model().model_json_schema(), indent=2))


@app.command("docs")
def docs(
    output: Path = typer.Option(None, "--output", "-o", help="Write to this file instead of printing."),
) -> None:
    """Print the configuration reference as Markdown (docs/config.md is generated with this)."""
    from agenttune.entrypoints.cli.config_docs import generate

    text = generate()
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {output}")
