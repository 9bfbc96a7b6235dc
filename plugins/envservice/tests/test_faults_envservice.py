"""Fault injection with an EnvService environment: a debug run and a local training run (tiny model).

On top of the faults of the core's tests/test_faults_runs.py (workflows that raise or hang, an engine
that fails requests, a judge that raises; see agenttune.testing.faults), the test EnvService server
answers 10% of requests with 503 and is killed (SIGKILL) once mid-run, then started again on the
same port. The runs finish all their steps; every failure is counted by cause; no episode is lost
from the rollout log; every instance the live server created is released, and every environment
an episode opened was released or died with the killed server; no thread or process is left.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agenttune_envservice import env_for
from conftest import EnvServer, free_port, server_command, wait_healthy

from agenttune import JudgeResult
from agenttune.plugin_api import keep_after_run, load_config, train_from_config
from agenttune.testing.faults import (
    JOURNAL,
    FaultPlan,
    FaultyJudge,
    FaultyWorkflow,
    Snapshot,
    check_run,
    failing_generate,
    repeat_of,
)

pytest.importorskip("torch")

TINY = "tiny://envfaults?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"
ENVIRONMENTS: list[Any] = []  # every environment an episode opened, in this process
WILL_STEP: list[Any] = []  # those of episodes planned to reach env.step() (no fault, or a flaky engine)


class FaultyGuessWorkflow(FaultyWorkflow):
    """Opens the episode's environment before its fault strikes, then guesses once."""

    plan = FaultPlan(seed="envservice-faults-13")  # every fault among the server's 8 train tasks x 4

    async def setup(self, task, tuner) -> None:
        env = env_for(task, tuner)
        ENVIRONMENTS.append(env)
        if self.plan.fault(task.task_id, repeat_of(tuner.episode_id)) in (None, "flaky"):
            WILL_STEP.append(env)
        tuner.update_judge_input_dictionary(messages=await env.reset())

    async def ask(self, task, tuner) -> str:
        env = env_for(task, tuner)
        client = tuner.as_async_openai_client(max_retries=1)
        reply = await client.chat.completions.create(model=tuner.model_name, messages=env.messages)
        text = reply.choices[0].message.content or ""
        await env.step(text)
        return text


class FaultyEnvJudge(FaultyJudge):
    """Raises where planned; otherwise the environment's own score (an /evaluate request)."""

    async def judge(self, judge_input):
        await super().judge(judge_input)  # raises for the planned judge faults
        score = await judge_input.handed["env"].evaluate(sparse=False)
        return JudgeResult(reward=score, success=score >= 1.0)


def an_episode_will_lose_its_instance() -> bool:
    """True while an episode holds a created instance it has yet to step: a kill now must fail it.

    Without this the kill could land between episodes (all in flight done with the server, the next
    not yet started) and, the server back before the next create, fail nothing.
    """
    return any(env.messages and env.steps == 0 and not env.released for env in list(WILL_STEP))


class KillOnce:
    """Kills the server with SIGKILL after `after_steps` /step calls, while an episode holds an instance
    it has yet to step, then starts it again on its port."""

    def __init__(self, server: EnvServer, restart: Callable[[int], EnvServer], after_steps: int):
        self.server, self.restart, self.after_steps = server, restart, after_steps
        self.restarted: EnvServer | None = None
        self.last_stats: dict[str, Any] = {}  # the server's counters just before it was killed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="test-kill-once")

    def __enter__(self) -> KillOnce:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.last_stats = self.server.stats()
                if self.last_stats["steps"] >= self.after_steps and an_episode_will_lose_its_instance():
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        else:
            return
        self.server.kill()
        self.restarted = self.restart(int(self.server.url.rsplit(":", 1)[1]))


@pytest.fixture
def faults(monkeypatch):
    from agenttune.plugin_api import HFEngine

    JOURNAL.clear()
    ENVIRONMENTS.clear()
    WILL_STEP.clear()
    monkeypatch.setattr(HFEngine, "generate", failing_generate(HFEngine.generate))
    yield Snapshot.take()
    JOURNAL.clear()


@pytest.fixture
def server_on(tmp_path: Path) -> Iterator[Callable[[int], EnvServer]]:
    """Starts the test server on a given port, answering 10% of POSTs with 503; stops them all after."""
    servers: list[EnvServer] = []

    def start(port: int) -> EnvServer:
        log = tmp_path / f"env-server-{port}-{len(servers)}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(server_command(port, "--fail-every", "10", "--tasks", "8"), stdout=output,
                                       stderr=subprocess.STDOUT)
        keep_after_run(process.pid)  # restarted during the run; this fixture stops it
        servers.append(EnvServer(f"http://127.0.0.1:{port}", process, log))
        wait_healthy(servers[-1].url, process, log)
        return servers[-1]

    yield start
    for server in servers:
        server.kill()


def config_for(url: str, **sections: Any) -> Any:
    data: dict[str, Any] = {
        "project_name": "envservice-faults",
        "workflow": "test_faults_envservice:FaultyGuessWorkflow",
        "judge": {"judge_protocol": "test_faults_envservice:FaultyEnvJudge", "timeout": 30},
        "task_reader": {"type": "env_service", "env_type": "guess", "url": url, "timeout": 10},
        "model": {"path": TINY, "max_model_len": 512},
        "engine": {"type": "hf"},
        "rollout": {"num_repeat": 4, "max_env_worker": 32, "episode_timeout": 15.0,
                    "max_response_length_in_one_turn": 8, "compute_madness_checklist": []},
        "monitor": {"tensorboard": False},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return load_config(data)


def lost_with_the_server(record: dict[str, Any]) -> bool:
    """Failures the kill caused: an environment request that failed, in the workflow or the judge."""
    return record["status"] in ("workflow_error", "judge_error") and "EnvService" in (record["error"] or "")


def test_the_plan_covers_every_fault():
    planned = {FaultyGuessWorkflow.plan.fault(f"train-{index}", repeat) for index in range(8) for repeat in range(4)}
    assert planned == {None, "raise", "hang", "engine", "flaky", "judge"}


@pytest.mark.parametrize("backbone", ["debug", "local"])
def test_a_run_survives_a_flaky_and_once_killed_environment_server(backbone, tmp_path: Path, faults, server_on):
    server = server_on(free_port())
    steps = {"debug": [1], "local": [1, 2, 3]}[backbone]
    # Episodes run in waves, so that the kill finds some finished, some in flight and some not yet started.
    sections = {"debug": {"debug": {"first_n_tasks": 8, "max_parallel": 8}},
                "local": {"data": {"train_batch_size": 4, "max_prompt_length": 256, "max_response_length": 64},
                          "trainer": {"total_steps": 3, "learning_rate": 1e-3},
                          "local": {"device": "cpu", "plot": False, "keep_checkpoints": 1}}}[backbone]
    per_step = {"debug": 32, "local": 16}[backbone]
    config = config_for(server.url, backbone=backbone, **sections)
    with KillOnce(server, server_on, after_steps={"debug": 12, "local": 20}[backbone]) as killer:
        run = train_from_config(config, run_dir=tmp_path / "run")
    assert killer.restarted is not None, "the server was never killed: the run ended first"

    reports = check_run(run.run_dir, steps=steps, episodes_per_step=per_step, also_failed=lost_with_the_server)
    statuses = set().union(*(report.statuses for report in reports))
    assert {"ok", "workflow_error", "timeout"} <= statuses
    stats = killer.restarted.stats()
    assert stats["live"] == [] and stats["created"] == stats["released"], stats  # the live server: all released
    assert killer.last_stats["failed_on_purpose"] > 0  # the 503s came, and were ridden out or counted
    opened = [env for env in ENVIRONMENTS if env.created]
    assert opened and all(env.released for env in opened), "an episode's environment was never released"
    records = [json.loads(line) for path in sorted((run.run_dir / "rollouts").glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    assert sum(lost_with_the_server(record) for record in records) > 0, "the kill failed no episode at all"
    assert faults.new_threads() == []
    started = faults.new_children()
    assert list(started) == [killer.restarted.process.pid], started  # only the test's own restarted server
