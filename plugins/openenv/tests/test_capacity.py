"""A server at its session limit (CAPACITY_REACHED): a new episode waits for a free session, up to
`capacity_wait`, then fails naming the limit and the setting. The solo server takes one session."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from agenttune_openenv.session import OpenEnvSession, OpenEnvSpec
from test_runs import config_for, records

from agenttune.plugin_api import EnvironmentFailure, train_from_config


def session(url: str, seed: int, **spec: float) -> OpenEnvSession:
    return OpenEnvSession(OpenEnvSpec(url=url, reset={"seed": seed}, **spec), f"task-{seed}")


async def until(condition, what: str, timeout: float = 60.0) -> None:
    """Poll `condition` (a bound on a hang, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.05)


async def test_a_new_episode_waits_while_the_server_is_full_and_gets_the_freed_session(solo_server):
    first, second = session(solo_server.url, 1), session(solo_server.url, 2)
    await first.reset()
    waiting = asyncio.create_task(second.reset())
    try:
        await until(lambda: second.capacity_waits >= 2, "the second session was refused and tried again")
        assert not waiting.done()  # still waiting: the one session is the first episode's
        await first.step({"message": "hi"})
        await first.close()
        result = await asyncio.wait_for(waiting, timeout=60)
        assert result.observation["echoed_message"].startswith("Echo ready (seed 2)")
        assert (await second.step({"message": "hey"})).reward == pytest.approx(0.3)
    finally:
        waiting.cancel()
        await first.close()
        await second.close()
    await until(lambda: solo_server.stats()["live"] == 0, "the server dropped both instances")


async def test_a_server_that_stays_full_fails_the_episode_naming_its_limit_and_the_setting(solo_server):
    first, second = session(solo_server.url, 1), session(solo_server.url, 2, capacity_wait=0.5)
    await first.reset()
    try:
        with pytest.raises(EnvironmentFailure) as failure:
            await second.reset()
        message = str(failure.value)
        assert "stayed full for capacity_wait=0.5s" in message
        assert "at most 1 session at once (its max_concurrent_envs)" in message
        assert "task_reader.capacity_wait" in message and "CAPACITY_REACHED" in message
        assert second.capacity_waits >= 1
        assert (await first.step({"message": "ok"})).reward == pytest.approx(0.2)  # the first one was untouched
    finally:
        await first.close()
        await second.close()
    await until(lambda: solo_server.stats()["live"] == 0, "the server dropped the instance")


def test_two_episodes_at_once_on_a_one_session_server_both_finish(tmp_path: Path, solo_server):
    before = solo_server.stats()
    # Two episodes of one task at once; slow replies keep the first one's session taken for a while.
    config = config_for(tmp_path, replace={"openenv": {"url": solo_server.url}},
                        engine={"replies": ["hey"], "cycle": True, "delay": 0.3},
                        task_reader={"train_size": 1}, debug={"first_n_tasks": 1, "max_parallel": 2})
    run = train_from_config(config, run_dir=tmp_path / "run")
    episodes = records(run.run_dir)
    assert len(episodes) == 2 and {episode["status"] for episode in episodes} == {"ok"}
    assert [episode["reward"] for episode in episodes] == pytest.approx([0.6, 0.6])  # two steps of "hey" each
    assert "the OpenEnv server is full; waiting for a free session" in (run.run_dir / "log.jsonl").read_text()
    stats = solo_server.stats()
    assert stats["resets"] - before["resets"] == 2 and stats["live"] == 0
