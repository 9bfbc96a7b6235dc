"""`agenttune tinker serve`: a Tinker-compatible server on the local trainer (see agenttune/entrypoints/tinker/)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="A Tinker-compatible server: the `tinker` SDK and tinker-cookbook train on this machine.",
                  no_args_is_help=True)

API_KEY_ENV = "AGENTTUNE_TINKER_API_KEY"


@app.command("serve")
def serve(
    model: str = typer.Option("tiny://default", "--model", help="The base model: a Hugging Face directory, hub id "
                                                                "or tiny://NAME. Clients name it as base_model."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback lets the "
                                                         "network train and sample the model."),
    state_dir: Path = typer.Option(Path("~/.cache/agenttune/tinker"), "--state-dir",
                                   help="Where tinker:// checkpoints are kept; they outlive the server."),
    api_key: str = typer.Option(None, "--api-key", envvar=API_KEY_ENV, show_default=False,
                                help="The one API key accepted (it must start with tml-); by default any key "
                                     "starting with tml- is."),
    allow_host: list[str] = typer.Option(None, "--allow-host", help="A host name clients may address besides "
                                         "loopback (repeatable); other Host and Origin headers are refused "
                                         "while --host is loopback."),
    record_batches: Path = typer.Option(None, "--record-batches", show_default=False,
                                        help="Append every datum trained on (forward_backward) to this JSON-lines "
                                             "file: token ids and loss inputs, one line per call."),
) -> None:
    """Serve MODEL to the `tinker` SDK: LoRA training clients, sampling and tinker:// checkpoints."""
    from rich.console import Console

    from agenttune.errors import UserError

    try:
        import tinker  # noqa: F401 - the server reads and writes the SDK's own types
    except ImportError:
        raise UserError("`agenttune tinker serve` needs the tinker SDK.",
                        hint="pip install 'agenttune[tinker]' (tinker==0.38.0).") from None
    if api_key is not None and not api_key.startswith("tml-"):
        raise UserError("--api-key must start with tml- (the tinker SDK sends no other key).",
                        hint=f"Pass a key like tml-mysecret, or leave --api-key and {API_KEY_ENV} unset.")
    from agenttune.entrypoints.tinker.server import serve as serve_forever

    console = Console(stderr=True, highlight=False, soft_wrap=True)

    def ready(base_url: str) -> None:
        console.print(f"agenttune tinker serve: {model}, checkpoints in {state_dir}", markup=False)
        key = "the --api-key" if api_key else "any tml-... API key"
        console.print(f"Tinker base URL: [bold]{base_url}[/] ({key}); Ctrl-C stops", markup=True)

    serve_forever(model, host=host, port=port, state_dir=state_dir, api_key=api_key,
                  allow_hosts=tuple(allow_host or ()), on_ready=ready, batch_record=record_batches)
