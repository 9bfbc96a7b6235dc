"""Episodes against the test server through agenttune's real rollout stack (gateway, tuner, rollout engine).

The model is scripted (it guesses 3, 5, 7, 9, ...); everything else is real: the task reader lists the
server's tasks, workflows play through `env_for`, the `env_service` judge evaluates each instance, and
the server's own counters show that every instance created was released — also when the workflow
raised, hung past its timeout, was cancelled, or the server died mid-episode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import EnvServer, free_port

from agenttune.plugin_api import EpisodeStatus, build_config, rollout_session

TINY = "tiny://envservice?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"


def make_config(url: str, workflow: str = "GuessWorkflow", **sections: Any) -> Any:
    data: dict[str, Any] = {
        "workflow": f"guess_workflows:{workflow}",
        "backbone": "debug",
        "model": {"path": TINY, "max_model_len": 1024},
        "engine": {"type": "scripted", "replies": ["3", "5", "7", "9"], "cycle": True},
        "task_reader": {"type": "env_service", "env_type": "guess", "url": url, "timeout": 10},
        "judge": {"type": "env_service", "sparse": True, "timeout": 30},
        "rollout": {"num_repeat": 2, "max_env_worker": 4, "episode_timeout": 30, "max_turns": 6},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return build_config(data, {})


async def roll_out(config: Any, limit: int = 3) -> list[Any]:
    async with rollout_session(config) as session:
        tasks = session.tasks("train", limit=limit)
        return await session.rollout.run_tasks(tasks)


def assert_all_released(server: EnvServer) -> dict[str, Any]:
    stats = server.stats()
    assert stats["live"] == [], f"instances left on the server: {stats['live']}"
    assert stats["created"] == stats["released"]
    return stats


async def test_episodes_are_played_judged_and_released(env_server: EnvServer) -> None:
    episodes = await roll_out(make_config(env_server.url))
    assert len(episodes) == 6
    for episode in episodes:
        assert episode.status is EpisodeStatus.OK, episode.error
        won = "Correct!" in episode.output["observations"]  # what the environment told the agent
        assert episode.success is won
        assert episode.reward == (1.0 if won else 0.0)
        assert episode.judge_details["env_score"] == episode.reward
        assert episode.judge_details["instance_id"] == episode.output["instance_id"]
        assert episode.metrics["calls"] == len(episode.output["observations"])
    assert {episode.success for episode in episodes} == {True, False}  # the script wins some, loses some
    assert assert_all_released(env_server)["created"] == 6


async def test_shaping_as_in_the_appworld_recipe(env_server: EnvServer) -> None:
    config = make_config(env_server.url, judge={"sparse": False, "score_scale": 0.5, "success_bonus": 1.0})
    episodes = await roll_out(config, limit=4)
    for episode in episodes:
        score = episode.judge_details["env_score"]
        assert episode.reward == pytest.approx(0.5 * score + (1.0 if score >= 1 else 0.0))
    assert any(0 < episode.judge_details["env_score"] < 1 for episode in episodes)  # dense partial credit
    assert_all_released(env_server)


async def test_a_raising_workflow_still_releases(env_server: EnvServer) -> None:
    episodes = await roll_out(make_config(env_server.url, "RaisingWorkflow"), limit=2)
    assert [episode.status for episode in episodes] == [EpisodeStatus.WORKFLOW_ERROR] * 4
    assert "the agent crashed mid-episode" in episodes[0].error
    assert assert_all_released(env_server)["created"] == 4


async def test_a_workflow_past_its_timeout_still_releases(env_server: EnvServer) -> None:
    config = make_config(env_server.url, "HangingWorkflow", rollout={"episode_timeout": 1.0})
    episodes = await roll_out(config, limit=2)
    assert [episode.status for episode in episodes] == [EpisodeStatus.TIMEOUT] * 4
    assert assert_all_released(env_server)["created"] == 4


async def test_cancelling_the_batch_releases_every_instance(env_server: EnvServer) -> None:
    config = make_config(env_server.url, "HangingWorkflow")
    async with rollout_session(config) as session:
        batch = asyncio.ensure_future(session.rollout.run_tasks(session.tasks("train", limit=2)))
        deadline = time.monotonic() + 20
        while env_server.stats()["created"] < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert env_server.stats()["created"] == 4
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
    assert_all_released(env_server)


async def test_a_workflow_without_an_environment_is_a_clear_judge_error(env_server: EnvServer) -> None:
    episodes = await roll_out(make_config(env_server.url, "NoResetWorkflow"), limit=1)
    assert [episode.status for episode in episodes] == [EpisodeStatus.JUDGE_ERROR] * 2
    assert "created no environment" in episodes[0].error and "env_for(task, tuner)" in episodes[0].error
    assert env_server.stats()["created"] == 0


async def test_intermittent_5xx_do_not_fail_episodes(start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--fail-every", "4")
    episodes = await roll_out(make_config(server.url))
    assert [episode.status for episode in episodes] == [EpisodeStatus.OK] * 6
    stats = assert_all_released(server)
    assert stats["failed_on_purpose"] >= 3


async def test_slow_responses_fail_episodes_cleanly(start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--delay", "0.6")
    async with rollout_session(make_config(server.url)) as session:
        tasks = session.tasks("train", limit=2)  # listing tasks may take its time (timeout 10 s) ...
        for task in tasks:  # ... but every environment request of the episodes times out
            task.metadata["env_service"]["timeout"] = 0.3
        episodes = await session.rollout.run_tasks(tasks)
    assert [episode.status for episode in episodes] == [EpisodeStatus.WORKFLOW_ERROR] * 4
    assert "/create" in episodes[0].error and "ReadTimeout" in episodes[0].error
    await asyncio.sleep(1.0)  # requests the client gave up on finish on the server
    assert_all_released(server)  # the timed-out creates were released by id all the same


async def test_the_server_dying_mid_episode_fails_episodes_not_the_step(
        start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--exit-after-steps", "3")
    started = time.monotonic()
    episodes = await roll_out(make_config(server.url), limit=3)
    assert time.monotonic() - started < 60  # nothing hung (the episode timeout is 30 s)
    assert server.process.wait(timeout=10) == 3
    statuses = [episode.status for episode in episodes]
    assert len(episodes) == 6
    assert statuses.count(EpisodeStatus.OK) < 6
    failed = [episode for episode in episodes if episode.status.failed]
    assert failed
    for episode in failed:
        assert episode.status in (EpisodeStatus.WORKFLOW_ERROR, EpisodeStatus.JUDGE_ERROR)
        assert "EnvService" in episode.error and "failed" in episode.error
    for episode in episodes:
        if episode.status is EpisodeStatus.OK:  # finished before the crash: judged for real
            assert "env_score" in episode.judge_details


async def test_an_unreachable_server_is_a_user_error_when_reading_tasks() -> None:
    from agenttune.plugin_api import UserError

    config = make_config(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UserError, match="Cannot list the 'train' tasks of environment 'guess'.*ConnectError"):
        await roll_out(config)


async def test_killing_the_server_mid_episode_fails_episodes_and_the_batch_completes(
        start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--delay", "0.2")
    async with rollout_session(make_config(server.url)) as session:
        batch = asyncio.ensure_future(session.rollout.run_tasks(session.tasks("train", limit=3)))
        deadline = time.monotonic() + 30
        while server.stats()["steps"] < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        server.process.kill()  # SIGKILL, mid-episode
        episodes = await asyncio.wait_for(batch, timeout=60)  # completes, does not hang
    assert len(episodes) == 6
    failed = [episode for episode in episodes if episode.status.failed]
    assert failed
    assert all("EnvService" in episode.error for episode in failed)
