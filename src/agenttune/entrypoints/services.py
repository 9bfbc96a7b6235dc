"""Services a run needs beside the backbone: environment servers, judge models, ...

Plugins hand them over through the `run_services(config, run)` hook as context managers;
`run_services` below enters them all before the backbone starts and exits them, in reverse order,
when the run ends — normally, on an error, or on Ctrl-C. A service that cannot start stops the run
before any rollout. A service that is a server process of the run's own builds on `ServiceProcess`
(the EnvService and OpenEnv plugins' launchers) and tells episodes where it is with `exported_variable`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

from agenttune.config.models import AgentTuneConfig
from agenttune.config.run import Run
from agenttune.errors import UserError
from agenttune.registry.manager import get_plugin_manager


@contextmanager
def run_services(config: AgentTuneConfig, run: Run) -> Iterator[None]:
    with ExitStack() as stack:
        for manager in get_plugin_manager().pm.hook.run_services(config=config, run=run):
            stack.enter_context(manager)
        yield


class ServiceProcess:
    """A service's server, run as a child process in a process group of its own (so that stopping it also
    stops what it started), its output appended to `log_path`. Launching again (a restart) reuses the log."""

    def __init__(self, name: str, log_path: Path):
        self.name = name  # "the {name} server" in messages
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    def launch(self, argv: list[str], *, cwd: str | None, env: dict[str, str], hint: str) -> subprocess.Popen[bytes]:
        """Start `argv`; a command that cannot start is one paragraph (`hint`: which settings to check)."""
        if self._log_file is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            self._close_log()
            raise UserError(f"Cannot start the {self.name} server {argv[0]!r}: {error}.", hint=hint) from error
        return self.process

    def stop(self, timeout: float) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after `timeout` seconds."""
        process = self.process
        if process is not None and process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._close_log()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)  # start_new_session made the server its group's leader
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def exported_variable(name: str, value: str) -> Iterator[None]:
    """`name=value` in this process's environment while the run lasts (workers and episodes inherit it),
    the previous value restored after."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
