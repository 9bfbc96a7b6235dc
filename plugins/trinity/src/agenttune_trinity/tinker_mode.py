"""Trinity-RFT on a machine without GPUs: its Tinker mode against `agenttune tinker serve`.

`trinity.model.tinker.enable: true` turns on Trinity's own Tinker mode: its explorer samples and its
trainer trains through the tinker SDK (LoRA, `forward_backward_custom` with Trinity's policy loss,
`optim_step`), and Ray is asked for no GPU. With no `trinity.model.tinker.base_url`, the backbone
serves the Tinker API itself on this machine: `agenttune tinker serve` on the run's model, in its own
process on a loopback port, with a fresh API key, its state in `<run_dir>/tinker` (checkpoints, its log,
and `batches.jsonl`: every token id the trainer trained on), stopped when the run ends; the run gets a Ray
cluster of its own, since the server is reachable from this machine only. Everything else is Trinity's own
loop: launcher, explorer, buffer, workflow runners (with agenttune's workflow inside), trainer,
synchronizer, checkpoints. With a base URL, the run uses that server (hosted Tinker, or an `agenttune
tinker serve` on another machine) and starts none.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agenttune.plugin_api import AgentTuneConfig, UserError, get_logger
from agenttune_trinity.options import tinker_mode

log = get_logger("trinity")

READY_TIMEOUT_S = 300  # loading the model on a slow CPU machine
STOP_TIMEOUT_S = 30
BATCHES = "batches.jsonl"  # every datum Trinity's trainer sends (`--record-batches`): what it trained on
BASE_URL = re.compile(r"Tinker base URL: (http://\S+)")


@dataclass(frozen=True)
class TinkerServer:
    """Where Trinity's actors find the Tinker API: `TINKER_BASE_URL` and `TINKER_API_KEY`."""

    base_url: str
    api_key: str
    local: bool = False  # started by the backbone on this machine's loopback

    def env(self) -> dict[str, str]:
        return {"TINKER_BASE_URL": self.base_url, "TINKER_API_KEY": self.api_key, "TINKER_TELEMETRY": "0"}


@contextmanager
def tinker_server(config: AgentTuneConfig, model_path: str, run_dir: Path) -> Iterator[TinkerServer | None]:
    """The server Trinity's Tinker mode talks to for this run: one started here, a named one, or None
    (Tinker mode off). Its variables are in this process's environment while the run lasts, so the
    Ray cluster this process starts passes them to every actor."""
    tinker = tinker_mode(config)
    if tinker is None:
        yield None
        return
    if tinker.get("base_url"):
        server = TinkerServer(str(tinker["base_url"]), os.environ.get("TINKER_API_KEY", ""))
        with _environment(server.env()):
            yield server
        return
    with _served(model_path, run_dir / "tinker") as server, _environment(server.env()):
        yield server


@contextmanager
def _served(model_path: str, state_dir: Path) -> Iterator[TinkerServer]:
    """`agenttune tinker serve` on `model_path`, on a free loopback port, until the block ends."""
    state_dir.mkdir(parents=True, exist_ok=True)
    api_key = f"tml-agenttune-{secrets.token_hex(16)}"
    log_path = state_dir / "server.log"  # appended to: a resumed run's server writes after the first one's
    start = log_path.stat().st_size if log_path.exists() else 0
    command = [sys.executable, "-m", "agenttune", "tinker", "serve", "--model", model_path, "--host", "127.0.0.1",
               "--port", "0", "--state-dir", str(state_dir), "--api-key", api_key,
               "--record-batches", str(state_dir / BATCHES)]
    with log_path.open("ab") as output:  # a file, not a pipe: a full pipe would stall the server
        process = subprocess.Popen(command, stdout=output, stderr=output, start_new_session=True)
    try:
        base_url = _wait_for_base_url(process, log_path, start)
        log.info("serving the Tinker API for Trinity-RFT's Tinker mode", base_url=base_url, model=model_path,
                 log=str(log_path))
        yield TinkerServer(base_url, api_key, local=True)
    finally:
        _stop(process)


def _wait_for_base_url(process: subprocess.Popen[bytes], log_path: Path, start: int) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        with log_path.open("rb") as output:
            output.seek(start)
            found = BASE_URL.search(output.read().decode(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise UserError(f"`agenttune tinker serve`, which Trinity-RFT's Tinker mode samples and trains through, "
                            f"exited with status {process.returncode} before it was ready: "
                            f"{_last_line(log_path)}",
                            hint=f"See {log_path}. The model must load with transformers on this machine "
                                 "(model.path), and agenttune[local,tinker] must be installed.")
        time.sleep(0.2)
    raise UserError(f"`agenttune tinker serve` was not ready after {READY_TIMEOUT_S} s.",
                    hint=f"See {log_path}; a large model loads slowly on CPU: try a smaller model.path.")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C for the server (it saves nothing on the way out: its checkpoints are written when made)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(no output)"
