"""`agenttune tinker serve`: the model, the state directory and the app, on uvicorn until Ctrl-C.

The server is the hardened one of `agenttune serve` (`agenttune.web`): per-connection timeouts and a
connection cap, rate-limited warnings, the request-body limit, and the Host/Origin check while it
listens on loopback.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from agenttune.web import ServerLimits

DEFAULT_STATE_DIR = Path("~/.cache/agenttune/tinker")
MIB = 2**20
# forward_backward batches are larger than chat requests: the body limit is raised to what the SDK sends
# in one chunk (fwdbwd_max_chunk_bytes_count: 5 MB) with room to spare.
LIMITS = ServerLimits(max_body_bytes=64 * MIB)


def build_state(model: str, state_dir: Path, *, device: str = "auto", poll_s: float = 20.0,
                batch_record: Path | None = None) -> Any:
    """The model loaded, the checkpoint store opened: what the app serves."""
    from agenttune.components.engines.model_loading import resolve_model_path
    from agenttune.entrypoints.tinker.app import TinkerState
    from agenttune.entrypoints.tinker.checkpoints import CheckpointStore
    from agenttune.entrypoints.tinker.futures import Futures
    from agenttune.entrypoints.tinker.models import ModelHost

    host = ModelHost(model, resolve_model_path(model, key="--model"), device=device)
    return TinkerState(host, CheckpointStore(state_dir.expanduser()), Futures(poll_s=poll_s),
                       batch_record=batch_record)


def serve(model: str, *, host: str = "127.0.0.1", port: int = 8000, state_dir: Path = DEFAULT_STATE_DIR,
          api_key: str | None = None, allow_hosts: tuple[str, ...] = (), on_ready: Any = print,
          batch_record: Path | None = None) -> None:
    """Serve until Ctrl-C; `on_ready(base_url)` once the socket listens."""
    from agenttune.entrypoints.tinker.app import build_app
    from agenttune.web.connections import guarded_server_class, uvicorn_config
    from agenttune.web.requests import allowed_hosts

    state = build_state(model, state_dir, batch_record=batch_record)
    app = build_app(state, api_key=api_key, limits=LIMITS, allowed_hosts=allowed_hosts(host, allow_hosts))
    sock = _bind(host, port)
    server = guarded_server_class()(uvicorn_config(app, LIMITS, log_level="warning"))
    shown = f"[{host}]" if ":" in host else host
    on_ready(f"http://{shown}:{sock.getsockname()[1]}")
    try:
        server.run(sockets=[sock])
    finally:
        state.futures.close()
        sock.close()


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before uvicorn starts: a port in use is a clear error at once."""
    from agenttune.errors import UserError

    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, protocol)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as error:
        raise UserError(f"Cannot listen on {host}:{port}: {error.strerror or error}.",
                        hint="Pass another --port (0: any free port), or an address of this machine with --host.") from None
    sock.listen(128)
    return sock
