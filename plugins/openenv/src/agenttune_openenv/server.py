"""The OpenEnv server of a run: started, watched, restarted when it dies, stopped with the run.

    openenv:
      app: my_env.server.app:app      # an ASGI app: uvicorn serves it on a free loopback port
      # command: python -m my_env.server.app --port {port}    # or any command; {port} is filled in
      # image: registry.hf.space/openenv-echo-env:latest      # or a Docker image (`docker run`)
      # url: https://someone-my-env.hf.space                  # or a server that already runs
      max_restarts: 3

With `app`, `command` or `image`, `agenttune train` starts the server before any rollout, waits until
`GET {url}/health` answers 200, exports the URL as AGENTTUNE_OPENENV_URL for the length of the run
(episodes find their server there), and stops its whole process group when the run ends. Its output
goes to `<run_dir>/openenv_server.log`. If the server dies during the run, the episodes it was
serving fail with status `environment_error` (each counted in `failures/environment_error`), and it
is started again on the same port, up to `max_restarts` times. What happened to it is written to
`<run_dir>/openenv_server_news.json` (exported as AGENTTUNE_OPENENV_NEWS), where new episodes, in
workflow processes too, see that it is being restarted and wait for it.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx

from agenttune.plugin_api import ServiceProcess, UserError, exported_variable, get_logger
from agenttune_openenv.news import NEWS_VARIABLE, NewsFile
from agenttune_openenv.section import OpenEnvSection
from agenttune_openenv.session import URL_VARIABLE

log = get_logger("openenv.server")


DOCKER_TIMEOUT_S = 30.0  # `docker info` / `docker rm`: a daemon that does not answer in this is not usable


def check_docker(image: str) -> None:
    """openenv.image needs a Docker client and a daemon it reaches: one paragraph when either is missing."""
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              text=True, timeout=DOCKER_TIMEOUT_S, check=False)
    except FileNotFoundError:
        why = "there is no `docker` command on PATH"
    except subprocess.TimeoutExpired:
        why = f"`docker info` did not answer within {DOCKER_TIMEOUT_S:g}s"
    else:
        if done.returncode == 0:
            return
        said = (done.stderr or done.stdout).strip().splitlines()
        why = f"`docker info` failed ({said[-1] if said else f'exit code {done.returncode}'})"
    raise UserError(
        f"openenv.image ({image}) is run with Docker, and Docker is not usable here: {why}. Start the Docker "
        "daemon (or install Docker), or run the container elsewhere and give its address as openenv.url, or "
        "install the environment's Python package and name its app as openenv.app, which needs no Docker.",
        hint="See docs/openenv.md, 'Where the environment runs'.")


def remove_container(name: str) -> None:
    """`docker rm -f`: the container of a `docker run` client that was killed outlives it."""
    try:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=DOCKER_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("could not remove the OpenEnv container", container=name, error=repr(error))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


class ServerProcess:
    """One launched OpenEnv server: started, watched, restarted on death, stopped."""

    def __init__(self, section: OpenEnvSection, log_path: Path, search_path: Path | None = None):
        self.section = section
        self.search_path = search_path
        self.port = section.port or free_port()
        self.url = (section.url or f"http://127.0.0.1:{self.port}").rstrip("/")
        self.log_path = log_path
        # Episodes read it to wait for a restart, or to name the death in their error, in any process.
        self.news = NewsFile(log_path.with_name("openenv_server_news.json"))
        self.child = ServiceProcess("OpenEnv", log_path)
        self.deaths: list[int] = []  # exit codes of the deaths during the run
        self.restarts = 0
        self._stopping = threading.Event()
        self.container = f"agenttune-openenv-{os.getpid()}-{self.port}" if section.image else None

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self.child.process

    @property
    def argv(self) -> list[str]:
        if self.section.app:
            # uvicorn comes with openenv (a dependency of its server side); one worker: sessions live in memory.
            return [sys.executable, "-m", "uvicorn", self.section.app, "--host", "127.0.0.1",
                    "--port", str(self.port), "--log-level", "warning"]
        if self.section.image and self.container:
            # In the foreground: its output goes to the log, and its exit is the server's death.
            variables = [flag for name, value in self.section.env.items() for flag in ("-e", f"{name}={value}")]
            return ["docker", "run", "--rm", "--name", self.container,
                    "-p", f"127.0.0.1:{self.port}:{self.section.image_port}", *variables, self.section.image]
        command = self.section.command
        parts = list(command) if isinstance(command, list) else shlex.split(command or "")
        return [part.replace("{port}", str(self.port)) for part in parts]

    def start(self) -> None:
        if healthy(self.url):
            raise UserError(
                f"Something already answers at {self.url}/health, so agenttune will not start the OpenEnv "
                "server (openenv.app / openenv.command) a second time.",
                hint="Stop the running server, or remove openenv.app / openenv.command to use it as it is.")
        self._launch()
        self._wait_until_healthy()
        threading.Thread(target=self._watch, daemon=True, name="agenttune-openenv-watchdog").start()
        log.info("the OpenEnv server is up", url=self.url, log=str(self.log_path))

    def _launch(self) -> None:
        if self.container:
            remove_container(self.container)  # a dead one's name would be taken
        argv = self.argv
        process = self.child.launch(argv, cwd=self.section.cwd, env=self._environment(),
                                    hint="Check openenv.command and openenv.cwd.")
        log.info("starting the OpenEnv server", command=argv, pid=process.pid)

    def _environment(self) -> dict[str, str]:
        environment = {**os.environ, **self.section.env, "PYTHONUNBUFFERED": "1"}
        # An app module next to the config file is found, as a workflow module there is.
        if self.search_path is not None:
            paths = [str(self.search_path), environment.get("PYTHONPATH", "")]
            environment["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
        return environment

    def _wait_until_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.section.healthcheck_timeout
        while not healthy(self.url):
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                self.stop()
                what = (f"exited with code {code} before answering" if code is not None else
                        f"did not answer within {self.section.healthcheck_timeout:g}s at")
                raise UserError(f"The OpenEnv server {what} {self.url}/health. Its last output:\n{self.log_tail()}",
                                hint=f"See {self.log_path}; check openenv.app (module:attribute, importable from "
                                     "openenv.cwd) or openenv.command and openenv.url.")
            time.sleep(0.2)

    def _watch(self) -> None:
        """Wait on the server; when it dies during the run, say so and start it again."""
        while True:
            assert self.process is not None
            code = self.process.wait()
            if self._stopping.is_set():
                return
            self.deaths.append(code)
            what = f"the OpenEnv server exited with code {code} during the run (its output: {self.log_path})"
            if self.restarts >= self.section.max_restarts:
                self.news.note(self.url, f"{what}; openenv.max_restarts={self.section.max_restarts} is used up")
                log.error("the OpenEnv server died and openenv.max_restarts is used up; episodes will fail",
                          exit_code=code, restarts=self.restarts, log=str(self.log_path))
                return
            self.news.note(self.url, f"{what}; it is being started again", restarting=True)
            log.error("the OpenEnv server died; starting it again", exit_code=code, log=str(self.log_path))
            if not self._restart():
                self.news.note(self.url, f"{what}; starting it again failed")
                return

    def _restart(self) -> bool:
        """Start the server again on its port; False when that cannot be done (or the run is stopping)."""
        self.restarts += 1
        try:
            self._launch()
        except UserError as error:
            log.error("could not start the OpenEnv server again", error=str(error))
            return False
        deadline = time.monotonic() + self.section.healthcheck_timeout
        while not self._stopping.is_set():
            if healthy(self.url):
                self.news.note(self.url, None)
                log.info("the OpenEnv server is up again", url=self.url, restarts=self.restarts)
                return True
            if self.process is None or self.process.poll() is not None or time.monotonic() > deadline:
                log.error("the restarted OpenEnv server did not come up", log=str(self.log_path))
                return self.process is not None and self.process.poll() is not None  # a death: _watch counts it
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after stop_timeout."""
        self._stopping.set()
        self.child.stop(self.section.stop_timeout)
        if self.container:
            remove_container(self.container)
        self.news.note(self.url, None)
        if self.deaths:
            log.warning("the OpenEnv server had died during the run", deaths=len(self.deaths),
                        restarts=self.restarts, log=str(self.log_path))

    def log_tail(self, lines: int = 15) -> str:
        return self.child.log_tail(lines)


def exported_url(url: str) -> AbstractContextManager[None]:
    return exported_variable(URL_VARIABLE, url.rstrip("/"))


@contextmanager
def openenv_server_for_run(section: OpenEnvSection, run_dir: Path,
                           search_path: Path | None = None) -> Iterator[ServerProcess | None]:
    """The run's OpenEnv server: launched (and stopped) for `app`/`command`/`image`; its URL exported either way."""
    if section.image:
        check_docker(section.image)
    if not (section.app or section.command or section.image):
        if not section.url:
            yield None
            return
        with exported_url(section.url):
            yield None
        return
    server = ServerProcess(section, run_dir / "openenv_server.log", search_path)
    server.start()
    try:
        with exported_url(server.url), exported_variable(NEWS_VARIABLE, str(server.news.path)):
            yield server
    finally:
        server.stop()
