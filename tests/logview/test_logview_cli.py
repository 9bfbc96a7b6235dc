"""`agenttune logview` and `agenttune train --with-logview`, as a user runs them."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from logview_runs import write_run

from agenttune.logview.server import exposure_warning, is_loopback

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai_agent"
URL = re.compile(r"http://[^\s/]+/")


class Process:
    """A running `python -m agenttune ...`, its output collected line by line."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None,
                 sigint_ignored: bool = False):
        """`sigint_ignored`: start it as a non-interactive shell starts `cmd &` (SIGINT ignored)."""
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "agenttune", *args], cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
            # PYTHONFAULTHANDLER: a process that outlives Ctrl-C prints every thread's stack on SIGABRT
            env={**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1", **(env or {})})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output)
            if match:
                return match
            if self.popen.poll() is not None:
                time.sleep(0.2)  # let the reader catch the last lines
                match = re.search(pattern, self.output)
                if match:
                    return match
                raise AssertionError(f"exited ({self.popen.returncode}) without {pattern!r}:\n{self.output}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.output}")

    def interrupt(self) -> int:
        """Ctrl-C, as a user stops it: the exit code (130, the shell's code for Ctrl-C, or 0)."""
        self.popen.send_signal(signal.SIGINT)
        try:
            return self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.send_signal(signal.SIGABRT)
            time.sleep(3)
            raise AssertionError(f"still running 20 s after Ctrl-C (stacks at the end):\n{self.output}") from None
        finally:
            if self.popen.poll() is None:
                self.popen.kill()

    def stopped_cleanly(self) -> bool:
        code = self.interrupt()
        time.sleep(0.2)
        return code in (0, 130) and "Traceback" not in self.output


@pytest.mark.slow
def test_logview_serves_a_directory_until_ctrl_c(tmp_path):
    write_run(tmp_path / "runs" / "demo" / "run1", steps=1)
    viewer = Process("logview", "--port", "0", cwd=tmp_path)  # no PATH: ./runs
    url = viewer.wait_for(URL.pattern)[0]
    assert url.startswith("http://127.0.0.1:")
    assert f"serving {(tmp_path / 'runs').resolve()}" in viewer.output
    assert "WARNING" not in viewer.output
    runs = httpx.get(url + "api/runs").json()["runs"]
    assert [run["id"] for run in runs] == ["demo/run1"]
    assert httpx.get(url).text.startswith("<!doctype html>")
    assert viewer.stopped_cleanly(), viewer.output


@pytest.mark.slow
def test_a_non_loopback_host_is_warned_about_loudly(tmp_path):
    write_run(tmp_path / "run", steps=1, validation=False)
    viewer = Process("logview", str(tmp_path / "run"), "--host", "0.0.0.0", "--port", "0", cwd=tmp_path)
    port = viewer.wait_for(r"http://0\.0\.0\.0:(\d+)/")[1]
    assert "WARNING: The log viewer listens on 0.0.0.0, not on loopback" in viewer.output
    assert "no password" in viewer.output
    # Reached by another name (as from another machine), it answers: the user chose this address.
    response = httpx.get(f"http://127.0.0.1:{port}/api/runs", headers={"Host": "my-workstation:8181"})
    assert response.status_code == 200
    assert viewer.stopped_cleanly(), viewer.output


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                                ("127.0.0.2", True), ("0.0.0.0", False), ("::", False),
                                                ("192.168.1.10", False), ("example.com", False)])
def test_loopback_is_recognised(host, loopback):
    assert is_loopback(host) is loopback
    assert (exposure_warning(host) is None) is loopback


def test_missing_or_wrong_paths_are_clear_errors(run_cli, tmp_path):
    result = run_cli("logview", tmp_path / "nope")
    assert result.exit_code == 2
    assert "does not exist" in result.error and "Pass a run directory" in result.error
    (tmp_path / "notes.txt").write_text("hello")
    result = run_cli("logview", tmp_path / "notes.txt")
    assert result.exit_code == 2 and "is not a rollout file" in result.error
    assert "Traceback" not in result.output


def test_a_port_in_use_is_a_clear_error(run_cli, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("logview", tmp_path, "--port", port)
    assert result.exit_code == 2
    assert f"Cannot listen on 127.0.0.1:{port}" in result.error
    assert "--port 0" in result.error


def test_logview_is_in_the_help(run_cli):
    result = run_cli("--help")
    assert "logview" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["from-a-terminal", "started-with-sigint-ignored"])
def test_train_with_logview_serves_the_run_while_and_after_it_runs(write_yaml, tmp_path, sigint_ignored):
    """The debug backbone on the example agent (scripted replies), with the viewer beside it.

    Ctrl-C stops it however it was started: a process started by `cmd &` in a script (or by some CI
    runners) inherits SIGINT ignored, and this test once hung only when pytest itself was started so.
    """
    config = write_yaml({
        "workflow": "facts_agent:FactsWorkflow",
        "task_reader": {"type": "file", "path": str(EXAMPLE / "tasks.jsonl")},
        "judge": {"judge_protocol": "facts_judge:ContainsAnswerJudge"},
        "model": {"path": "tiny://default", "max_model_len": 1024},
        "engine": {"type": "scripted", "replies": ["Paris is the capital."]},
        "rollout": {"num_repeat": 2, "max_turns": 2},
        "debug": {"first_n_tasks": 2, "max_parallel": 1},
    })
    run_dir = tmp_path / "run"
    train = Process("train", "--conf", str(config), "--backbone", "debug", "--run-dir", str(run_dir),
                    "--with-logview", cwd=tmp_path, env={"PYTHONPATH": str(EXAMPLE)},
                    sigint_ignored=sigint_ignored)
    url = train.wait_for(r"Log viewer: (http://127\.0\.0\.1:\d+/)")[1]
    assert f"(run directory {run_dir})" in train.output
    train.wait_for("Training finished. The log viewer is still at")
    [run] = httpx.get(url + "api/runs").json()["runs"]
    [step] = run["steps"]
    assert (step["step"], step["split"], run["has_metrics"]) == (1, "train", True)
    episodes = httpx.get(url + "api/episodes", params={"file": step["id"]}).json()
    assert episodes["total"] == 4
    assert {row["task_id"] for row in episodes["episodes"]} == {"capital-france", "currency-japan"}
    record = httpx.get(url + "api/episode", params={"file": step["id"], "index": 0}).json()
    assert record["samples"][0]["response_tokens"]  # the token view has its text
    assert train.stopped_cleanly(), train.output
