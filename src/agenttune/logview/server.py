"""Running the viewer: in the foreground (`agenttune logview`) or in a thread beside training.

The socket is bound here, before uvicorn starts, so a port already in use is a clear error at once
(or, beside training, a free port instead) rather than a log line from a server thread.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agenttune.errors import UserError
from agenttune.web import ServerLimits
from agenttune.web.binding import is_loopback
from agenttune.web.connections import guarded_server_class, uvicorn_config
from agenttune.web.requests import allowed_hosts

if TYPE_CHECKING:
    import uvicorn

DEFAULT_PORT = 8181
START_TIMEOUT_S = 10.0


def exposure_warning(host: str) -> str | None:
    """What to tell the user when the viewer is reachable from other machines (None on loopback)."""
    if is_loopback(host):
        return None
    return (f"The log viewer listens on {host}, not on loopback: anyone who can reach this machine can "
            "read every prompt, tool result and model output of these runs, and there is no password. "
            "Use the default --host 127.0.0.1 and forward the port (ssh -L 8181:127.0.0.1:8181 ...) "
            "unless this network is trusted.")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise UserError(f"Cannot listen on host {host!r}: {error.strerror}.",
                        hint="Pass an IP address or host name of this machine with --host (default 127.0.0.1).") from None
    family, kind, protocol, _, address = infos[0]
    sock = socket.socket(family, kind, protocol)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise UserError(f"Cannot listen on {host}:{port}: {error.strerror}.",
                        hint="Another program (another log viewer?) may use the port: pass --port with "
                             "another number, or --port 0 for any free port.") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _server(root: Path, host: str, *, log_level: str, limits: ServerLimits | None = None,
            allow_hosts: tuple[str, ...] = ()):
    from agenttune.logview.app import create_app

    app = create_app(root, allowed_hosts=allowed_hosts(host, allow_hosts))
    return guarded_server_class()(uvicorn_config(app, limits or ServerLimits(), log_level=log_level))


def serve(root: Path, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, on_ready=print,
          limits: ServerLimits | None = None, allow_hosts: tuple[str, ...] = ()) -> None:
    """Serve `root` until Ctrl-C. `on_ready(url)` is called once the socket listens. `allow_hosts`: Host
    and Origin names a loopback viewer answers to besides the loopback ones."""
    sock = bind(host, port)
    server = _server(root, host, log_level="warning", limits=limits, allow_hosts=allow_hosts)
    on_ready(url_of(sock, host))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


@dataclass
class BackgroundViewer:
    """A viewer in a daemon thread (it ends with the process, or at `stop()`)."""

    url: str
    _server: uvicorn.Server
    _thread: threading.Thread
    _sock: socket.socket

    def stop(self) -> None:
        self._server.should_exit = True
        self._server.force_exit = True  # don't wait for browsers' keep-alive connections to close
        self._thread.join(timeout=5)
        self._sock.close()

    def wait(self) -> None:
        """Block until Ctrl-C or SIGTERM (the server keeps answering meanwhile)."""
        try:
            with _interrupted_by(signal.SIGINT, signal.SIGTERM):
                while self._thread.is_alive():
                    time.sleep(0.2)  # not join(): a KeyboardInterrupt inside join() can mark the thread stopped
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()


@contextmanager
def _interrupted_by(*signals: signal.Signals):
    """Raise KeyboardInterrupt on these signals while inside, whatever the handlers were before.

    A process started in the background by a non-interactive shell (`cmd &` in a script, nohup, some CI
    runners) inherits SIGINT *ignored*, and Python then never raises KeyboardInterrupt: the viewer
    would outlive every Ctrl-C and `kill -INT`. uvicorn sets its own handlers the same way for
    `agenttune logview`.
    """
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def start_in_background(root: Path, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                        fall_back_to_free_port: bool = False, limits: ServerLimits | None = None) -> BackgroundViewer:
    """Start a viewer over `root` in a thread and return once it answers."""
    try:
        sock = bind(host, port)
    except UserError:
        if not fall_back_to_free_port:
            raise
        sock = bind(host, 0)
    server = _server(root, host, log_level="error", limits=limits)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="agenttune-logview",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise UserError("The log viewer did not start.", hint="Run `agenttune logview` on the run "
                            "directory by itself to see why.")
        time.sleep(0.01)
    return BackgroundViewer(url_of(sock, host), server, thread, sock)
