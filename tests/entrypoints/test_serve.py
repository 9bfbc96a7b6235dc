"""`agenttune serve` end to end (issue 23 item 4): the real command, the real `openai` client (sync,
async, streaming), tool_choice and response_format, a fuzz run without server errors, and the
rollout log it leaves, which the log viewer reads."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agenttune.logview.catalog import Catalog
from agenttune.rollout.log import read_records
from agenttune.testing.gateways import serve_process

# The gateway fuzz test's strategies, from tests/gateway/ (pytest puts only a test's own folder on sys.path).
GATEWAY_TESTS = str(Path(__file__).resolve().parents[1] / "gateway")
if GATEWAY_TESTS not in sys.path:
    sys.path.insert(0, GATEWAY_TESTS)
from test_gateway_fuzz import bodies, check, json_values  # noqa: E402

pytestmark = pytest.mark.slow  # a server process with the tiny model

SEED = 7
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    run_dir = tmp_path_factory.mktemp("serve") / "run"
    process, base_url = serve_process("--model", str(tiny_model_path), "--run-dir", str(run_dir),
                                      "rollout.max_response_length_in_one_turn=64")
    yield base_url, run_dir, process
    if process.poll() is None:
        process.kill()


def test_models_and_sync_async_and_streamed_chat(server):
    base_url, _, _ = server
    client = openai.OpenAI(base_url=base_url, api_key="sync-conversation", max_retries=0)
    assert [model.id for model in client.models.list().data] == [str(Path(client.models.list().data[0].id))]
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hello"}])
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens > 0

    async def asynchronous():
        async_client = openai.AsyncOpenAI(base_url=base_url, api_key="async-conversation", max_retries=0)
        # Seeded: the random tiny model's reply is the same every run (unseeded, it was now and then
        # one token long, streamed as a single delta).
        first = await async_client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}],
                                                           seed=SEED)
        stream = await async_client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Hi"}, first.choices[0].message.model_dump(
                exclude_none=True), {"role": "user", "content": "More"}], stream=True,
            stream_options={"include_usage": True}, seed=SEED)
        chunks = [chunk async for chunk in stream]
        await async_client.close()
        return chunks

    chunks = asyncio.run(asynchronous())
    assert chunks[-1].usage.completion_tokens > 0
    # Text came token by token: as content, or as reasoning where the random model opened <think> (a
    # reply that never closes it is content in the end, sent whole as the stream's last delta).
    texts = [chunk for chunk in chunks if chunk.choices and (
        chunk.choices[0].delta.content or getattr(chunk.choices[0].delta, "reasoning_content", None))]
    assert len(texts) > 1


def test_tool_choice_and_response_format_are_enforced(server):
    base_url, _, _ = server
    client = openai.OpenAI(base_url=base_url, api_key="guided", max_retries=0)
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Weather?"}],
                                           tools=[WEATHER], tool_choice=named)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "JSON please"}],
                                           response_format={"type": "json_schema", "json_schema": {
                                               "name": "yes", "schema": {"type": "object", "properties": {
                                                   "ok": {"type": "boolean"}}, "required": ["ok"],
                                                   "additionalProperties": False}}})
    assert isinstance(json.loads(reply.choices[0].message.content)["ok"], bool)


served_bodies = bodies.flatmap(lambda body: st.fixed_dictionaries({}, optional={
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}])
    | json_values}).map(lambda extra: {**body, **extra}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(body=served_bodies, key=st.sampled_from(["fuzz", "fuzz.agent", ""]))
def test_fuzzed_requests_get_no_server_error(server, body, key):
    base_url, _, _ = server
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        check(client.post("/chat/completions", json=body, headers=headers))


def test_web_pages_and_oversized_requests_cannot_drive_the_server(server):
    """Issue 35: a cross-site "simple request" (text/plain, no key, a foreign Origin or Host) and a 50 MB
    body are refused with OpenAI-style errors; the server keeps answering ordinary clients."""
    base_url, _, _ = server
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    with httpx.Client(base_url=base_url, timeout=60) as client:
        refusals = {
            415: client.post("/chat/completions", content=body, headers={"Content-Type": "text/plain"}),
            403: client.post("/chat/completions", content=body, headers={
                "Content-Type": "application/json", "Origin": "https://evil.example"}),
            421: client.post("/chat/completions", content=body, headers={
                "Content-Type": "application/json", "Host": "evil.example"}),
            413: client.post("/chat/completions", content=b'{"messages": "' + b"x" * 50_000_000 + b'"}',
                             headers={"Content-Type": "application/json"}),
        }
        for status, reply in refusals.items():
            assert reply.status_code == status and reply.json()["error"]["message"], (status, reply.text[:300])
        assert client.post("/chat/completions", content=body, headers={"Content-Type": "application/json"}
                           ).status_code == 200


def test_stopping_writes_every_conversation_to_the_rollout_log(server):
    base_url, run_dir, process = server
    client = openai.OpenAI(base_url=base_url, api_key="last-words", max_retries=0)
    client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Bye"}])
    streamed = openai.OpenAI(base_url=base_url, api_key="streamed", max_retries=0)
    list(streamed.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}], stream=True))
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0
    [log] = (run_dir / "rollouts").glob("step_*_serve.jsonl")
    records = {record.episode_id: record for record in read_records(log)}
    assert {"last-words", "streamed"} <= set(records)  # (and the other tests' conversations, in this process)
    streamed_record = records["streamed"]
    assert streamed_record.messages[0] == {"role": "user", "content": "Hi"}
    assert streamed_record.messages[-1]["role"] == "assistant" and streamed_record.metrics["calls"] == 1
    last = records["last-words"]
    assert last.metrics["calls"] == 1
    [sample] = last.samples
    assert sample.response_tokens and len(sample.response_tokens) == len(sample.response_ids)
    assert sum(sample.loss_mask) == last.metrics["generated_tokens"]
    [run] = Catalog(run_dir).runs()  # what `agenttune logview <run_dir>` lists
    assert [(step.step, step.split) for step in run.steps] == [(0, "serve")]


def test_bad_input_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "agenttune", "serve", "--conf", str(tmp_path / "missing.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "missing.yaml" in result.stderr and "Traceback" not in result.stderr


def test_flags_reach_the_config_as_strings_and_numbers_as_meant(tmp_path):
    from agenttune.entrypoints.cli.serve_cmd import serve_overrides
    from agenttune.registry.config_loading import load_config

    config = load_config(None, serve_overrides(None, "007", "127.0.0.1", 0, ["rollout.max_turns=3"]))
    assert config.model.path == "007" and config.gateway.port == 0 and config.rollout.max_turns == 3
    assert load_config(None, serve_overrides(None, None, "127.0.0.1", 9000, [])).model.path == "tiny://default"
    conf = tmp_path / "c.yaml"
    conf.write_text("model:\n  path: tiny://other\n")
    assert load_config(conf, serve_overrides(conf, None, "127.0.0.1", 9000, [])).model.path == "tiny://other"
