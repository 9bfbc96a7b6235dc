"""What the gateway protects (see SECURITY.md): it listens on loopback unless told otherwise and says so
loudly when told; every chat request needs a live episode key, which cannot be guessed or derived
from another one.
"""

from __future__ import annotations

import math
import re
import secrets
import socket
from collections import Counter

import httpx
import pytest
import structlog

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.config.models import AgentTuneConfig
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.web.binding import is_loopback

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


def engine() -> ScriptedEngine:
    return ScriptedEngine(["Hello."], tokenizer=tiny_tokenizer(), cycle=True)


def other_addresses() -> list[str]:
    """This machine's addresses other than loopback (what another machine would connect to)."""
    addresses = set()
    for info in socket.getaddrinfo(socket.gethostname(), None, family=socket.AF_INET):
        addresses.add(info[4][0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # the route's source address; sends nothing
        try:
            probe.connect(("192.0.2.1", 9))
            addresses.add(probe.getsockname()[0])
        except OSError:
            pass
    return sorted(address for address in addresses if not is_loopback(address))


def test_the_default_config_binds_loopback():
    assert AgentTuneConfig().gateway.host == "127.0.0.1"


async def test_the_gateway_is_not_reachable_from_other_addresses_by_default():
    addresses = other_addresses()
    if not addresses:
        pytest.skip("this machine has no address but loopback")
    async with running_gateway(engine()) as gateway, httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{gateway.root_url}/health")).status_code == 200
        for address in addresses:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://{address}:{gateway.port}/health")


async def test_loopback_is_quiet_and_any_other_host_is_warned_about_loudly():
    with structlog.testing.capture_logs() as logs:
        async with running_gateway(engine()):
            pass
    assert not [entry for entry in logs if entry["log_level"] == "warning"]
    with structlog.testing.capture_logs() as logs:
        async with running_gateway(engine(), config=tiny_config(gateway={"host": "0.0.0.0"})) as gateway:
            addresses = other_addresses()
            if addresses:  # told to, it does listen on the other addresses
                async with httpx.AsyncClient(timeout=5) as client:
                    assert (await client.get(f"http://{addresses[0]}:{gateway.port}/health")).status_code == 200
    [warning] = [entry["event"] for entry in logs if entry["log_level"] == "warning"]
    assert warning.startswith("WARNING: the gateway listens on 0.0.0.0") and "not on loopback" in warning
    assert "only protection" in warning and "gateway.host: 127.0.0.1" in warning


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                                ("localhost", True), ("LOCALHOST", True), ("0.0.0.0", False),
                                                ("::", False), ("10.0.0.1", False), ("gateway.example", False)])
def test_loopback_is_recognised(host, loopback):
    assert is_loopback(host) is loopback


async def test_keys_are_long_random_and_unrelated():
    async with running_gateway(engine(), http=False) as gateway:
        keys = [gateway.open_episode(f"e{index}").key for index in range(2000)]
    assert len(set(keys)) == len(keys)
    assert all(len(key) == 32 for key in keys)  # 24 random bytes: 192 bits
    assert len({key[:8] for key in keys}) == len(keys)  # no shared prefix, no counter inside
    counts = Counter("".join(keys))  # base64url characters, close to uniform
    entropy = -sum(count / sum(counts.values()) * math.log2(count / sum(counts.values())) for count in counts.values())
    assert len(counts) == 64 and entropy > 5.95  # log2(64) = 6 bits per character


async def test_every_chat_route_needs_a_live_key_and_near_misses_fail():
    async with running_gateway(engine()) as gateway:
        channel, closed = gateway.open_episode("live"), gateway.open_episode("closed")
        gateway.close_episode(closed)
        key = channel.key
        near_misses = ["", "Bearer", key[:-1], key + "x", key.upper(), key[1:], f"{key} x", closed.key,
                       secrets.token_urlsafe(24), f".{key}", f"{key[:16]}.{key[16:]}", "*", "%", key.replace(key[0], "A")]
        async with httpx.AsyncClient(base_url=gateway.root_url) as client:
            for wrong in near_misses:
                if wrong == key:
                    continue
                for headers in ({"Authorization": f"Bearer {wrong}".strip()}, {"api-key": wrong}, {"x-api-key": wrong}):
                    response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
                    assert response.status_code == 401, (wrong, headers, response.text)
                if wrong.strip() and "/" not in wrong:
                    response = await client.post(f"/e/{wrong}/v1/chat/completions", json=CHAT)
                    assert response.status_code in (401, 404), (wrong, response.text)
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 401  # no key at all
            for headers in ({"Authorization": f"Bearer {key}"}, {"api-key": key}, {"Authorization": f"Bearer {key}.critic"}):
                assert (await client.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
            assert (await client.post(f"/e/{key}/v1/chat/completions", json=CHAT)).status_code == 200
    assert engine_calls_from(channel) == 4  # the refused requests never reached the model
    assert [sample.agent for sample in channel.samples()] == ["default", "default", "critic", "default"]


def engine_calls_from(channel) -> int:
    return int(channel.metrics()["calls"])


async def test_one_gateway_s_keys_do_not_open_another():
    async with running_gateway(engine()) as first, running_gateway(engine()) as second, httpx.AsyncClient() as client:
        key = first.open_episode("a").key
        response = await client.post(f"{second.base_url}/chat/completions", json=CHAT,
                                     headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 401


async def test_open_access_on_another_host_says_that_any_key_is_accepted():
    from agenttune.gateway import Gateway

    with structlog.testing.capture_logs() as logs:
        async with Gateway(engine(), tiny_tokenizer(), tiny_config(gateway={"host": "0.0.0.0"}), open_access=True):
            pass
    [warning] = [entry["event"] for entry in logs if entry["log_level"] == "warning"]
    assert "not on loopback" in warning and "every API key is accepted" in warning
    assert "only protection" not in warning


async def test_a_port_in_use_is_a_clear_error_not_an_exit():
    from agenttune.errors import UserError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"could not listen on 127.0.0.1:{port}"):  # not uvicorn's SystemExit(3)
            async with running_gateway(engine(), config=tiny_config(gateway={"port": port})):
                pass


def test_open_access_names_conversations_by_key_but_never_logs_what_may_be_a_secret():
    from agenttune.gateway.server import conversation_name

    assert conversation_name("agent-a") == "agent-a" and conversation_name("default") == "default"
    for secret in ("sk-proj-abcdefghijklmnop", "x" * 41, "a key with spaces", "../../etc"):
        name = conversation_name(secret)
        assert re.fullmatch(r"key-[0-9a-f]{12}", name) and secret not in name
    assert conversation_name("sk-1") == conversation_name("sk-1") != conversation_name("sk-2")


async def test_open_access_files_a_provider_key_under_its_digest():
    from agenttune.gateway import Gateway

    async with Gateway(engine(), tiny_tokenizer(), tiny_config(), open_access=True) as gateway:
        async with httpx.AsyncClient(base_url=gateway.base_url) as client:
            for key in ("sk-live-0123456789abcdef", "my-agent"):
                response = await client.post("/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
                assert response.status_code == 200, response.text
        ids = [channel.episode_id for channel in gateway.channels()]
    assert ids[1] == "my-agent" and re.fullmatch(r"key-[0-9a-f]{12}", ids[0])
