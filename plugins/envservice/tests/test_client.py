"""The EnvService client against the test server running as a real process: protocol and faults."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from agenttune_envservice.client import (
    EnvServiceClient,
    EnvServiceProtocolError,
    EnvServiceUnavailable,
)
from agenttune_envservice.demo_server import secret_of
from conftest import EnvServer, free_port

from agenttune.plugin_api import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=4, backoff=0.05, max_backoff=0.2)


async def test_one_episode_through_every_endpoint(env_server: EnvServer) -> None:
    async with EnvServiceClient(env_server.url, retry=FAST_RETRY) as client:
        await client.healthz()
        task_ids = await client.get_env_profile("guess", "train")
        assert task_ids == [f"train-{n}" for n in range(8)]
        task_id = task_ids[0]

        created = await client.create("guess", task_id, "inst-1")
        assert [message["role"] for message in created.state] == ["system", "user"]
        assert created.info == {"instance_id": "inst-1", "task_id": task_id}

        secret = secret_of(task_id)
        wrong = 1 if secret != 1 else 2
        stepped = await client.step("inst-1", {"role": "assistant", "content": f"I guess {wrong}"})
        assert stepped.state[0]["content"] in ("Higher.", "Lower.")
        assert (stepped.reward, stepped.is_terminated) == (0.0, False)
        assert await client.evaluate("inst-1", params={"sparse": True}) == 0.0
        assert 0.0 < await client.evaluate("inst-1", params={"sparse": False}) < 0.5  # dense: partial credit

        stepped = await client.step("inst-1", {"role": "assistant", "content": str(secret)})
        assert stepped.state[0]["content"] == "Correct!"
        assert (stepped.reward, stepped.is_terminated) == (1.0, True)
        assert await client.evaluate("inst-1") == 1.0
        assert (await client.get_info("inst-1"))["tries"] == 2

        assert await client.release("inst-1") is True
        assert await client.release("inst-1") is False  # already gone: said, not hidden
    assert env_server.stats()["live"] == []


async def test_a_bad_request_is_a_clear_protocol_error(env_server: EnvServer) -> None:
    async with EnvServiceClient(env_server.url, retry=FAST_RETRY) as client:
        with pytest.raises(EnvServiceProtocolError, match=r"/step \(instance nope\).*HTTP 400.*nope not found"):
            await client.step("nope", {"role": "assistant", "content": "1"})
        with pytest.raises(EnvServiceProtocolError, match="unknown env_type 'appworld'"):
            await client.get_env_profile("appworld")
    assert env_server.stats()["posts"] == 2  # client errors are not retried


async def test_an_unreachable_server_is_reported_not_papered_over() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with EnvServiceClient(url, retry=FAST_RETRY) as client:
        with pytest.raises(EnvServiceUnavailable, match=r"/get_env_profile at http://127\.0\.0\.1:\d+ failed: ConnectError"):
            await client.get_env_profile("guess")
        with pytest.raises(EnvServiceUnavailable, match="ConnectError"):
            await client.evaluate("inst")
        with pytest.raises(EnvServiceUnavailable):
            await client.healthz()


async def test_intermittent_5xx_are_retried(start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--fail-every", "3")  # every third POST gets a 503 before it is acted on
    async with EnvServiceClient(server.url, retry=FAST_RETRY) as client:
        assert len(await client.get_env_profile("guess")) == 8
        for n in range(4):
            await client.create("guess", f"train-{n}", f"i{n}")
            stepped = await client.step(f"i{n}", {"role": "assistant", "content": "5"})
            assert stepped.state  # a real answer every time, never a made-up one
            await client.evaluate(f"i{n}")
            assert await client.release(f"i{n}") is True
    stats = server.stats()
    assert stats["failed_on_purpose"] >= 5
    assert stats["created"] == stats["released"] == 4 and stats["steps"] == 4  # no step ran twice


async def test_persistent_5xx_fail_after_the_retries(start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--fail-every", "1")
    async with EnvServiceClient(server.url, retry=FAST_RETRY) as client:
        with pytest.raises(EnvServiceUnavailable, match="HTTP 503.*injected failure"):
            await client.evaluate("i0")
    assert server.stats()["posts"] == 4  # FAST_RETRY.attempts


async def test_a_slow_step_times_out_and_is_not_sent_twice(start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--delay", "1.5")
    async with EnvServiceClient(server.url, timeout=5, retry=FAST_RETRY) as client:
        await client.create("guess", "train-0", "slow")
    async with EnvServiceClient(server.url, timeout=0.4, retry=FAST_RETRY) as client:
        with pytest.raises(EnvServiceUnavailable, match=r"/step \(instance slow\).*ReadTimeout"):
            await client.step("slow", {"role": "assistant", "content": "5"})
    # The server may have acted on the step (it was only slow): sending it again could play a second move.
    assert server.stats()["posts"] == 2  # the create and one step


async def test_a_slow_idempotent_call_is_retried_then_reported(start_env_server: Callable[..., EnvServer]) -> None:
    server = start_env_server("--delay", "1.0")
    async with EnvServiceClient(server.url, timeout=0.3, retry=FAST_RETRY) as client:
        with pytest.raises(EnvServiceUnavailable, match="/get_env_profile.*ReadTimeout"):
            await client.get_env_profile("guess")
    assert server.stats()["posts"] == FAST_RETRY.attempts
