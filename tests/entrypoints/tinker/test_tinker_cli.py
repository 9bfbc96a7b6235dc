"""`agenttune tinker serve` as a user runs it: the command, the printed base URL, the SDK, Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

tinker = pytest.importorskip("tinker")

pytestmark = pytest.mark.slow  # a server process: torch and the tiny model load in it


def test_the_command_serves_the_sdk_and_stops_on_ctrl_c(tmp_path):
    command = [sys.executable, "-m", "agenttune", "tinker", "serve", "--model", "tiny://default", "--port", "0",
               "--state-dir", str(tmp_path / "state"), "--api-key", "tml-cli-test"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        base_url = _base_url(process)
        with tinker.ServiceClient(base_url=base_url, api_key="tml-cli-test") as service:  # closed before the server
            client = service.create_lora_training_client(base_model="tiny://default", rank=2).result()
            saved = client.save_state("from-the-cli").result()
        assert saved.path.endswith("/weights/from-the-cli")
        assert (tmp_path / "state").is_dir()
    finally:
        process.send_signal(signal.SIGINT)
        # uvicorn shuts down, then re-raises the SIGINT it caught: the shell's usual 130, no traceback
        assert process.wait(timeout=30) in (0, 130)
        assert "Traceback" not in process.stderr.read()


def _base_url(process: subprocess.Popen, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    assert process.stderr is not None
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}")
        found = re.search(r"Tinker base URL: (http://\S+)", line)
        if found:
            return found.group(1)
    raise AssertionError("the server printed no base URL")
