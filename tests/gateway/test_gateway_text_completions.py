"""`POST /v1/completions` over real loopback HTTP: the real `openai` client's completions call, prompt
scoring with the hf engine on the tiny model (checked against its own logits), and the refusals."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.testing import load_tiny_model, tiny_tokenizer
from agenttune.testing.gateways import running_gateway


async def test_the_openai_client_gets_a_completion_of_text_and_of_token_ids():
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine(["four", "five"], tokenizer=tokenizer)
    async with running_gateway(engine) as gateway:
        channel = gateway.open_episode("e1")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0)
        reply = await client.completions.create(model="m", prompt="two plus two is", max_tokens=8)
        assert reply.choices[0].text == "four" and reply.usage.completion_tokens == len(tokenizer.encode("four")) + 1
        ids = tokenizer.encode("two plus three is", add_special_tokens=False)
        reply = await client.completions.create(model="m", prompt=ids, max_tokens=8, logprobs=0)
        assert reply.choices[0].text == "five" and engine.prompts[-1] == ids
        assert len(reply.choices[0].logprobs.token_logprobs) == reply.usage.completion_tokens
        # scoring needs an engine that can: the scripted one cannot
        async with httpx.AsyncClient(base_url=channel.base_url, headers={"Authorization": f"Bearer {channel.key}"}) \
                as raw:
            refused = await raw.post("completions", json={"prompt": ids, "echo": True, "logprobs": 0})
        assert refused.status_code == 400 and "cannot score prompts" in refused.json()["error"]["message"]


async def test_prompt_scores_are_the_models_own_log_probs():
    torch = pytest.importorskip("torch")
    from agenttune.components.engines.hf import HFEngine

    tokenizer, model = tiny_tokenizer(), load_tiny_model()
    ids = tokenizer.encode("The weather in Paris is sunny today.", add_special_tokens=False)
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    expected = [float(expected[i, token]) for i, token in enumerate(ids[1:])]
    engine = HFEngine(model, tokenizer)
    try:
        async with running_gateway(engine) as gateway:
            channel = gateway.open_episode("e1")
            async with httpx.AsyncClient(base_url=channel.base_url,
                                         headers={"Authorization": f"Bearer {channel.key}"}) as client:
                echoed = (await client.post("completions", json={
                    "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})).json()["choices"][0]
                both = (await client.post("completions", json={
                    "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0})).json()["choices"][0]
                unknown = await client.post("completions", headers={"Authorization": "Bearer nobody"},
                                            json={"prompt": ids, "echo": True})
    finally:
        await engine.aclose()
    assert echoed["logprobs"]["token_logprobs"][0] is None
    assert echoed["logprobs"]["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    assert echoed["text"] == tokenizer.decode(ids) and echoed["token_ids"] == []
    assert [entry[str(token)]["logprob"] for entry, token in zip(both["prompt_logprobs"][1:], ids[1:], strict=True)] \
        == pytest.approx(expected, abs=1e-4)
    assert both["prompt_logprobs"][0] is None and len(both["token_ids"]) == 1
    assert unknown.status_code == 401


# Bodies a careless or hostile client may send: every field right, wrong, or missing.
def _either(good, bad):
    return good | bad


_json_scalars = st.none() | st.booleans() | st.integers(-3, 3000) | st.floats(allow_nan=True) | st.text(max_size=8)
_json = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=6)
_completion_bodies = st.fixed_dictionaries({"prompt": _either(st.lists(st.integers(0, 1023), min_size=1, max_size=20)
                                                              | st.text(min_size=1, max_size=20), _json)}, optional={
    key: _either(good, _json) for key, good in {
        "max_tokens": st.integers(0, 8), "echo": st.booleans(), "logprobs": st.integers(0, 3),
        "prompt_logprobs": st.integers(0, 2), "temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
        "seed": st.integers(0, 100), "stream": st.booleans()}.items()})


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(body=_completion_bodies | _json)
@example(body={"prompt": "0", "max_tokens": float("inf")})
@example(body={"prompt": [1, 2], "temperature": float("nan")})
def test_random_completion_bodies_get_an_answer_or_a_clear_refusal(body):
    async def post():
        engine = ScriptedEngine(["four"], tokenizer=tiny_tokenizer(), cycle=True)
        async with running_gateway(engine, http=False) as gateway:
            channel = gateway.open_episode("fuzz")
            async with httpx.AsyncClient(transport=channel.async_transport(),
                                         base_url="http://gateway.invalid") as client:
                # json.dumps, not httpx's json=: Python clients send NaN and Infinity, httpx refuses to
                return await client.post("/v1/completions", content=json.dumps(body),
                                         headers={"Authorization": f"Bearer {channel.key}",
                                                  "Content-Type": "application/json"})

    reply = asyncio.run(post())
    assert reply.status_code < 500, reply.text
    payload = reply.json()
    if reply.status_code >= 400:
        assert set(payload["error"]) == {"message", "type", "param", "code"} and payload["error"]["message"]
    else:
        assert payload["object"] == "text_completion" and isinstance(payload["choices"][0]["text"], str)
