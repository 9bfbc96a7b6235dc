"""`agenttune serve`: the model under training as an OpenAI-compatible server (see agenttune/entrypoints/serve.py)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def serve_overrides(conf: Path | None, model: str | None, host: str, port: int, overrides: list[str],
                    allow_hosts: list[str] | None = None) -> list[str]:
    """The flags as overrides, after the user's. Values are JSON-quoted: an override value is read as
    YAML, where a model directory named `007` or `yes` would become a number or a boolean."""
    model = model or (None if conf else "tiny://default")
    flags = {"model.path": model, "gateway.host": host, "gateway.port": port,
             "gateway.allowed_hosts": allow_hosts or None}
    return [*overrides, *(f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None)]


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    conf: Path = typer.Option(None, "--conf", help="A config file: its model, engine, gateway and rollout "
                                                   "sections are used (default: the tiny test model on hf)."),
    model: str = typer.Option(None, "--model", help="model.path: a Hugging Face directory, hub id or tiny://NAME."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback lets the "
                                                         "network talk to the model."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where the served conversations are recorded "
                                                         "(default runs/<project>/<experiment>/<time>)."),
    allow_host: list[str] = typer.Option(None, "--allow-host", help="gateway.allowed_hosts: a host name clients "
                                         "may address besides loopback (repeatable); other Host and Origin "
                                         "headers are refused while --host is loopback."),
    adapters: Path = typer.Option(None, "--adapters", help="With policies: a checkpoint's model/ directory; each "
                                                           "policy's adapter is loaded from model/<policy>/ and a "
                                                           "request's `model: <policy>` samples with it."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
) -> None:
    """Serve the configured model and engine at an OpenAI base URL, recording every conversation."""
    import asyncio

    from rich.console import Console

    from agenttune.config.run import prepare_run
    from agenttune.entrypoints.serve import serve as serve_forever
    from agenttune.registry.config_loading import load_config

    config = load_config(conf, serve_overrides(conf, model, host, port, overrides or [], allow_host))
    run = prepare_run(config, run_dir)
    console = Console(stderr=True, highlight=False, soft_wrap=True)  # one line each: scripts read the URL

    def ready(base_url: str) -> None:
        console.print(f"agenttune serve: {config.model.path} on the {config.engine.type} engine", markup=False)
        if config.policies.enabled:
            console.print(f"policies (model: NAME): {', '.join(config.policies.adapters)}", markup=False)
        console.print(f"OpenAI base URL: [bold]{base_url}[/] (any API key; each key is one conversation)",
                      markup=True)
        console.print(f"Recording to {run.rollouts_dir} (agenttune logview {run.run_dir}); Ctrl-C stops",
                      markup=False)

    asyncio.run(serve_forever(config, run.run_dir, ready=ready, adapters=adapters))
