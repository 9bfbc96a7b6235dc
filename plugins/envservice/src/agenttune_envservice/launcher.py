"""Starting the EnvService server as part of a run (ASTune's `--with-appworld`).

    env_service:
      command: python -m env_service.env_service --env appworld --portal 127.0.0.1 --port 8080
      cwd: /opt/EnvService
      url: http://127.0.0.1:8080
      healthcheck_timeout: 300

With `command` set, `agenttune train` starts the server before any rollout, waits until
`GET {url}/healthz` answers 200, and stops it (the whole process group) when the run ends, however it
ends. Its output goes to `<run_dir>/env_service.log`. While the run lasts, `url` is exported as
AGENTTUNE_ENV_SERVICE_URL, the `env_service` task reader's default.

If the server exits during the run, the run says so at once (an error in the log), every later
EnvService error names the exit code and the log file, episodes fail cleanly (status
workflow_error or judge_error), and the step completes.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import ServiceProcess, UserError, exported_variable, get_logger
from agenttune_envservice.client import note_server_exit, note_server_launched, note_server_stopped
from agenttune_envservice.reader import DEFAULT_URL, URL_VARIABLE

log = get_logger("envservice.launcher")


class EnvServiceSection(BaseModel):
    """The `env_service:` config section: the EnvService server a run uses, and how to start it."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(default=DEFAULT_URL, description="Base URL of the EnvService server.")
    command: str | list[str] | None = Field(
        default=None,
        description="Command that starts the server (a string is split like a shell would; no shell runs). "
                    "None: the server is already running, agenttune only uses it.")
    cwd: str | None = Field(default=None, description="Working directory of the command.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the command.")
    healthcheck_timeout: float = Field(default=300.0, gt=0,
                                       description="Seconds to wait for GET {url}/healthz to answer 200.")
    stop_timeout: float = Field(default=15.0, gt=0,
                                description="Seconds between SIGTERM and SIGKILL when stopping the server.")

    @property
    def argv(self) -> list[str]:
        if isinstance(self.command, list):
            return list(self.command)
        return shlex.split(self.command or "")


class ServerProcess:
    """One launched EnvService server: started, watched, stopped."""

    def __init__(self, section: EnvServiceSection, log_path: Path):
        self.section = section
        self.url = section.url.rstrip("/")
        self.log_path = log_path
        self.child = ServiceProcess("EnvService", log_path)
        self.exit_code: int | None = None  # set when it exited while it should have been running
        self._stopping = False

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self.child.process

    def start(self) -> None:
        if healthy(self.url):
            raise UserError(
                f"Something already answers at {self.url}/healthz, so agenttune will not start the EnvService "
                "server (env_service.command) a second time.",
                hint="Stop the running server, or remove env_service.command to use it as it is.")
        argv = self.section.argv
        if not argv:
            raise UserError("env_service.command is empty.", hint="Give the command that starts the server.")
        process = self.child.launch(argv, cwd=self.section.cwd, env={**os.environ, **self.section.env},
                                    hint="Check env_service.command and env_service.cwd.")
        log.info("starting the EnvService server", command=argv, pid=process.pid, log=str(self.log_path))
        self._wait_until_healthy()
        note_server_launched(self.url)
        threading.Thread(target=self._watch, daemon=True, name="agenttune-envservice-watchdog").start()
        log.info("the EnvService server is up", url=self.url)

    def _wait_until_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.section.healthcheck_timeout
        while not healthy(self.url):
            code = self.process.poll()
            if code is not None:
                self.stop()
                raise UserError(f"The EnvService server exited with code {code} before answering {self.url}/healthz. "
                                f"Its last output:\n{self.log_tail()}",
                                hint=f"See {self.log_path}; check env_service.command, cwd and url (port).")
            if time.monotonic() > deadline:
                self.stop()
                raise UserError(f"The EnvService server did not answer {self.url}/healthz within "
                                f"{self.section.healthcheck_timeout:g}s. Its last output:\n{self.log_tail()}",
                                hint="Raise env_service.healthcheck_timeout, or check that env_service.url "
                                     "matches the host and port the command serves on.")
            time.sleep(0.2)

    def _watch(self) -> None:
        assert self.process is not None
        code = self.process.wait()
        if self._stopping:
            return
        self.exit_code = code
        what = (f"the EnvService server agenttune started exited with code {code} during the run; "
                f"its output is in {self.log_path}")
        note_server_exit(self.url, what)
        log.error("the EnvService server died; episodes that need it will fail until the run ends",
                  url=self.url, exit_code=code, log=str(self.log_path))

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after stop_timeout."""
        self._stopping = True
        self.child.stop(self.section.stop_timeout)
        note_server_stopped(self.url)
        if self.exit_code is not None:
            log.error("the EnvService server had died during the run; episodes after that failed",
                      exit_code=self.exit_code, log=str(self.log_path))

    def log_tail(self, lines: int = 15) -> str:
        return self.child.log_tail(lines)


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def env_service_for_run(section: EnvServiceSection, run_dir: Path) -> Iterator[ServerProcess | None]:
    """The run's EnvService: launched (and stopped) when `command` is set; its URL exported either way."""
    with exported_variable(URL_VARIABLE, section.url.rstrip("/")):
        if not section.command:
            yield None
            return
        server = ServerProcess(section, run_dir / "env_service.log")
        server.start()
        try:
            yield server
        finally:
            server.stop()
