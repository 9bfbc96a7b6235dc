"""`agenttune train --backbone debug` end to end, with the EnvService server launched as part of the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from agenttune_envservice.launcher import healthy
from conftest import free_port, server_command

from agenttune.plugin_api import UserError, load_config, train_from_config
from agenttune.plugin_api import cli_main as agenttune_main

TINY = "tiny://envservice?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"
TESTS = Path(__file__).parent


def write_config(tmp_path: Path, port: int, *server_args: str, **sections: Any) -> Path:
    data: dict[str, Any] = {
        "project_name": "envservice-test",
        "workflow": "guess_workflows:GuessWorkflow",
        "model": {"path": TINY, "max_model_len": 1024},
        "engine": {"type": "scripted", "replies": ["3", "5", "7", "9"], "cycle": True},
        "task_reader": {"type": "env_service", "env_type": "guess"},  # the URL comes from env_service.url
        "judge": {"type": "env_service", "sparse": True},
        "rollout": {"num_repeat": 2, "episode_timeout": 30},
        "debug": {"first_n_tasks": 3, "max_parallel": 2},
        "env_service": {"command": server_command(port, *server_args), "url": f"http://127.0.0.1:{port}",
                        "healthcheck_timeout": 60},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    path = tmp_path / "guess.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def rollout_records(run_dir: Path) -> list[dict[str, Any]]:
    files = sorted((run_dir / "rollouts").glob("*.jsonl"))
    assert files, f"no rollout log in {run_dir}"
    return [json.loads(line) for file in files for line in file.read_text().splitlines() if line.strip()]


def test_debug_run_launches_uses_and_stops_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    port = free_port()
    config = load_config(write_config(tmp_path, port), backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    assert not healthy(f"http://127.0.0.1:{port}")  # stopped with the run
    records = rollout_records(run.run_dir)
    assert len(records) == 6
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert metrics[0]["failure_rate"] == 0.0
    assert (run.run_dir / "env_service.log").exists()


def test_the_cli_runs_it_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setattr(sys, "argv", ["agenttune", "train", "--conf", str(write_config(tmp_path, free_port())),
                                      "--backbone", "debug", "--run-dir", str(tmp_path / "run")])
    try:
        agenttune_main()
    except SystemExit as exit_:  # typer may exit explicitly; only success is fine
        assert exit_.code in (0, None), capsys.readouterr()
    output = capsys.readouterr().out
    assert "6 episodes" in output and "failed 0%" in output


def test_the_server_dying_mid_run_fails_episodes_and_the_run_says_so(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    port = free_port()
    config = load_config(write_config(tmp_path, port, "--exit-after-steps", "4"), backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")  # completes: the step is not brought down
    records = rollout_records(run.run_dir)
    failed = [record for record in records if record["status"] != "ok"]
    assert failed, "the server died; some episodes must have failed"
    for record in failed:
        assert "exited with code 3 during the run" in record["error"]
        assert "env_service.log" in record["error"]
    log = (run.run_dir / "log.jsonl").read_text()
    assert "the EnvService server died" in log


def test_a_server_that_does_not_start_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    port = free_port()
    path = write_config(tmp_path, port, env_service={
        "command": [sys.executable, "-c", "import sys; print('no appworld data here'); sys.exit(7)"]})
    with pytest.raises(UserError, match=r"(?s)exited with code 7 before answering.*no appworld data here"):
        train_from_config(load_config(path, backbone="debug"), run_dir=tmp_path / "run")


def test_a_port_already_in_use_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               env_server: Any) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    port = int(env_server.url.rsplit(":", 1)[1])
    path = write_config(tmp_path, port)
    with pytest.raises(UserError, match="already answers"):
        train_from_config(load_config(path, backbone="debug"), run_dir=tmp_path / "run")
    assert httpx.get(f"{env_server.url}/healthz").status_code == 200  # the running one is left alone
