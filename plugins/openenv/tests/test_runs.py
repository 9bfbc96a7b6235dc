"""`agenttune train --backbone debug` with OpenEnv environments: the server launched with the run,
rewards from the environment, and the faults: a server that never answers, one killed mid-run
(counted per episode and restarted), episodes cancelled (their instances released)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from agenttune_openenv.server import healthy
from conftest import TESTS, app_path, free_port

from agenttune.plugin_api import load_config, train_from_config

TINY = "tiny://openenv?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"


def config_data(replace: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    """The test config as YAML data: `sections` merge into the defaults, `replace` replaces whole sections."""
    data: dict[str, Any] = {
        "project_name": "openenv-test",
        "workflow": "agenttune_openenv:TextEnvWorkflow",
        "model": {"path": TINY, "max_model_len": 1024},
        "engine": {"type": "scripted", "replies": ["5", "no idea", "3", "7", "1", "9"], "cycle": True},
        "task_reader": {"type": "openenv", "train_size": 6, "validation_size": 2},
        "judge": {"type": "openenv"},
        "rollout": {"num_repeat": 2, "episode_timeout": 30, "max_turns": 3},
        "debug": {"first_n_tasks": 6, "max_parallel": 4},
        "monitor": {"tensorboard": False},
        "openenv": {"app": app_path("guess"), "cwd": str(TESTS), "healthcheck_timeout": 60},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return {**data, **(replace or {})}


def config_for(tmp_path: Path, replace: dict[str, Any] | None = None, **sections: Any) -> Any:
    return load_config(config_data(replace, **sections), backbone=sections.get("backbone", "debug"))


def records(run_dir: Path) -> list[dict[str, Any]]:
    files = sorted((run_dir / "rollouts").glob("*.jsonl"))
    assert files, f"no rollout log in {run_dir}"
    return [json.loads(line) for file in files for line in file.read_text().splitlines() if line.strip()]


def test_a_debug_run_plays_the_game_and_releases_every_instance(tmp_path: Path, guess_server):
    before = guess_server.stats()
    run = train_from_config(config_for(tmp_path, replace={"openenv": {"url": guess_server.url}}),
                            run_dir=tmp_path / "run")
    episodes = records(run.run_dir)
    assert len(episodes) == 12 and {episode["status"] for episode in episodes} == {"ok"}
    rewards = {episode["reward"] for episode in episodes}
    assert len(rewards) > 1, rewards  # the game rewards right, wrong and unreadable guesses differently
    assert any(episode["success"] for episode in episodes)
    for episode in episodes:  # the reward is the sum of the game's step rewards, kept in the log
        assert episode["reward"] == pytest.approx(sum(episode["judge_details"]["env_rewards"]))
    stats = guess_server.stats()
    assert stats["resets"] - before["resets"] == 12 and stats["live"] == 0


def test_the_echo_environment_rewards_what_it_echoes(tmp_path: Path, echo_server):
    server = echo_server
    config = config_for(tmp_path, replace={"openenv": {"url": server.url}},
                        judge={"reduce": "sum"}, engine={"replies": ["hey"], "cycle": True})
    run = train_from_config(config, run_dir=tmp_path / "run")
    episodes = records(run.run_dir)
    assert {episode["status"] for episode in episodes} == {"ok"}
    assert [episode["reward"] for episode in episodes] == pytest.approx([0.6] * 12)  # two steps, 3 characters each
    assert server.stats()["live"] == 0


def test_cancelled_episodes_release_their_instances(tmp_path: Path, guess_server):
    server = guess_server
    before = server.stats()
    config = config_for(tmp_path, workflow="openenv_workflows:HangAfterReset", rollout={"episode_timeout": 2},
                        replace={"openenv": {"url": server.url}})
    run = train_from_config(config, run_dir=tmp_path / "run")
    assert {episode["status"] for episode in records(run.run_dir)} == {"timeout"}
    deadline = time.monotonic() + 10
    while server.stats()["live"] and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = server.stats()
    assert stats["resets"] - before["resets"] == 12 and stats["live"] == 0, stats


def test_a_server_that_never_answers_fails_episodes_by_name_not_the_run(tmp_path: Path, guess_server):
    config = config_for(tmp_path, replace={"openenv": {"url": guess_server.url}},
                        task_reader={"message_timeout": 1.0, "reset": {"hang_on_step": True}})
    started = time.monotonic()
    run = train_from_config(config, run_dir=tmp_path / "run")
    assert time.monotonic() - started < 60
    episodes = records(run.run_dir)
    assert {episode["status"] for episode in episodes} == {"environment_error"}
    assert all("did not answer step within 1s" in episode["error"] for episode in episodes)
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert metrics[0]["failures/environment_error"] == 12


def test_no_session_is_a_judge_error(tmp_path: Path, guess_server):
    config = config_for(tmp_path, workflow="openenv_workflows:NoReset", replace={"openenv": {"url": guess_server.url}})
    run = train_from_config(config, run_dir=tmp_path / "run")
    episodes = records(run.run_dir)
    assert {episode["status"] for episode in episodes} == {"judge_error"}
    assert "opened no OpenEnv session" in episodes[0]["error"]


class KillOnce:
    """SIGKILLs the run's server after `after` resets, then records the restarted server's pid."""

    def __init__(self, url: str, after: int):
        self.url, self.after = url, after
        self.killed: int | None = None
        self.restarted: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="test-kill-once")

    def __enter__(self) -> KillOnce:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _stats(self) -> dict[str, Any] | None:
        try:
            return httpx.get(f"{self.url}/_stats", timeout=2).json()
        except httpx.HTTPError:
            return None

    def _watch(self) -> None:
        while not self._stop.is_set() and self.killed is None:
            stats = self._stats()
            if stats and stats["resets"] >= self.after:
                os.kill(stats["pid"], signal.SIGKILL)
                self.killed = stats["pid"]
            time.sleep(0.02)
        while not self._stop.is_set() and self.restarted is None:
            stats = self._stats()
            if stats and stats["pid"] != self.killed:
                self.restarted = stats["pid"]
            time.sleep(0.05)


def test_a_launched_server_killed_mid_run_is_counted_per_episode_and_restarted(tmp_path: Path):
    """The run starts the server (openenv.app), it is SIGKILLed mid-run, started again, and stopped at the end."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Slow replies keep episodes in flight when the kill comes; waves of 4 leave some for after the restart.
    config = config_for(tmp_path, openenv={"port": port}, debug={"first_n_tasks": 6, "max_parallel": 4},
                        engine={"delay": 0.3}, rollout={"num_repeat": 4})
    with KillOnce(url, after=6) as killer:
        run = train_from_config(config, run_dir=tmp_path / "run")
    assert killer.killed is not None, "the server was never killed: the run ended first"
    assert killer.restarted is not None, "the server was not started again"
    episodes = records(run.run_dir)
    assert len(episodes) == 24  # none lost
    failed = [episode for episode in episodes if episode["status"] != "ok"]
    assert failed and {episode["status"] for episode in failed} == {"environment_error"}
    assert all("exited with code -9" in episode["error"] or "dropped the session" in episode["error"]
               for episode in failed), [episode["error"] for episode in failed]
    assert sum(episode["status"] == "ok" for episode in episodes) > 0
    log = (run.run_dir / "log.jsonl").read_text()
    assert "the OpenEnv server died; starting it again" in log and "the OpenEnv server is up again" in log
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert metrics[0]["failures/environment_error"] == len(failed)
    assert not healthy(url)  # stopped with the run
    assert (run.run_dir / "openenv_server.log").exists()


def test_worker_processes_wait_for_a_launched_server_that_is_restarting(tmp_path: Path):
    """rollout.workflow_processes=2: the launcher's news of the restart reaches the episodes in the workers.

    New episodes there wait for the restarted server instead of failing, and the episodes that were
    in flight name the death, with the status environment_error (the failure's kind crosses the process
    boundary).
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # A worker's first episodes import openenv (seconds): a longer episode_timeout than the in-process test's.
    config = config_for(tmp_path, openenv={"port": port}, debug={"first_n_tasks": 6, "max_parallel": 4},
                        engine={"delay": 0.3},
                        rollout={"num_repeat": 4, "workflow_processes": 2, "episode_timeout": 180})
    with KillOnce(url, after=6) as killer:
        run = train_from_config(config, run_dir=tmp_path / "run")
    assert killer.killed is not None, "the server was never killed: the run ended first"
    assert killer.restarted is not None, "the server was not started again"
    episodes = records(run.run_dir)
    assert len(episodes) == 24
    failed = [episode for episode in episodes if episode["status"] != "ok"]
    assert {episode["status"] for episode in failed} == {"environment_error"}
    # Without the news a worker's episode that starts during the restart fails "could not be reached for
    # reset" with nothing more to say; with it, it waits and runs, and a failure names the death.
    assert all("EnvironmentFailure" in episode["error"] and (
        "exited with code -9" in episode["error"] or "dropped the session" in episode["error"])
        for episode in failed), [episode["error"] for episode in failed]
    assert 0 < len(failed) <= 4  # only the episodes in flight at the kill (max_parallel): the rest waited
    log = (run.run_dir / "log.jsonl").read_text()
    assert "the OpenEnv server died; starting it again" in log and "the OpenEnv server is up again" in log
    assert not healthy(url)
