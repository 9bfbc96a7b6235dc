"""`agenttune logview`: read rollouts token by token in the browser (see docs/logview.md)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("logview")(logview)


def logview(
    path: Path = typer.Argument(None, help="A directory of runs, a run directory, or a rollout .jsonl file "
                                           "(default: ./runs if it exists, else the current directory)."),
    port: int = typer.Option(8181, "--port", help="Port to listen on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback "
                                                         "shows your rollouts to the network."),
    allow_host: list[str] = typer.Option(None, "--allow-host", help="A host name the page may be opened under "
                                         "besides loopback (repeatable): other Host and Origin headers are "
                                         "refused while --host is loopback."),
    max_connections: int = typer.Option(1000, "--max-connections", min=1,
                                        help="Most open connections; more are answered 503."),
    request_timeout: float = typer.Option(30.0, "--request-timeout", min=0.1,
                                          help="Seconds a connection has to send a whole request."),
    keep_alive_timeout: float = typer.Option(30.0, "--keep-alive-timeout", min=0.1,
                                             help="Seconds an idle connection stays open."),
) -> None:
    """Serve a web page that shows runs, steps, episodes and every token of their trajectories."""
    from rich.console import Console

    from agenttune.logview.catalog import choose_root
    from agenttune.logview.server import exposure_warning, serve
    from agenttune.web import ServerLimits

    root = choose_root(path)
    console = Console(stderr=True, highlight=False)
    warning = exposure_warning(host)
    if warning:
        console.print(f"[bold red]WARNING:[/] {warning}", markup=True)

    def ready(url: str) -> None:
        console.print(f"agenttune logview: serving {root}", markup=False)
        console.print(f"Open [bold]{url}[/] (Ctrl-C to stop)", markup=True)

    limits = ServerLimits(request_timeout_s=request_timeout, keep_alive_timeout_s=keep_alive_timeout,
                          max_connections=max_connections)
    serve(root, host=host, port=port, on_ready=ready, limits=limits, allow_hosts=tuple(allow_host or ()))
