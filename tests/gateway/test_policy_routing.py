"""The gateway routes each agent's calls to its policy's adapter (config/policies.py) over real HTTP, with
the `hf` engine serving two adapters; an agent the map does not name goes to policies.default_policy
and is counted."""

from __future__ import annotations

import asyncio

import openai
import pytest

from agenttune.components.engines.hf import HFEngine
from agenttune.testing.gateways import running_gateway, tiny_config

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

POLICIES = {"adapters": {"writer": {"rank": 4}, "critic": {"rank": 4}},
            "agents": {"writer": "writer", "critic": "critic"}, "default_policy": "critic"}


@pytest.fixture
def two_adapters(tiny_model):
    torch.manual_seed(0)
    config = {"r": 4, "lora_alpha": 16, "target_modules": "all-linear", "init_lora_weights": False}
    model = peft.get_peft_model(tiny_model, peft.LoraConfig(**config), adapter_name="writer")
    model.add_adapter("critic", peft.LoraConfig(**config))
    return model.eval()


def adapter_logprobs(model, adapter, sample):
    """The adapter's own forward pass over the sample's ids, at the generated positions."""
    ids = sample.prompt_ids + sample.response_ids
    model.set_adapter(adapter)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    picked = torch.log_softmax(logits, -1)[len(sample.prompt_ids) - 1:-1].gather(
        1, torch.tensor(sample.response_ids)[:, None]).squeeze(1)
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    return picked[mask], torch.tensor(sample.logprobs)[mask]


async def test_each_agent_samples_with_its_policys_adapter(two_adapters, tiny_tokenizer):
    config = tiny_config(rollout={"max_response_length_in_one_turn": 12}, policies=POLICIES)
    engine = HFEngine(two_adapters, tiny_tokenizer)
    async with running_gateway(engine, config=config) as gateway:
        channel = gateway.open_episode("e0")

        async def call(agent: str) -> None:
            client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=channel.api_key(agent), max_retries=0)
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Hi {agent}"}])

        await asyncio.gather(*[call(agent) for agent in ("writer", "critic", "stranger")])
        samples = {sample.agent: sample for sample in channel.samples()}
    assert channel.counters["unknown_agent"] == 1  # the stranger; writer and critic are mapped
    # The rollout log's record of which policy sampled each sample (the log viewer shows and filters it).
    assert {agent: sample.policy for agent, sample in samples.items()} == {
        "writer": "writer", "critic": "critic", "stranger": "critic"}
    for agent, adapter in (("writer", "writer"), ("critic", "critic"), ("stranger", "critic")):
        expected, sampled = adapter_logprobs(two_adapters, adapter, samples[agent])
        assert len(sampled) > 0
        assert torch.allclose(sampled, expected, rtol=0, atol=1e-5), agent
    other, sampled = adapter_logprobs(two_adapters, "critic", samples["writer"])
    assert not torch.allclose(sampled, other, atol=1e-3)  # the writer's tokens were not the critic's
    await engine.aclose()


async def test_without_policies_no_call_names_an_adapter(two_adapters, tiny_tokenizer):
    """One policy (no policies: section): the engine samples with the model's active adapter, as before."""
    engine = HFEngine(two_adapters, tiny_tokenizer)
    config = tiny_config(rollout={"max_response_length_in_one_turn": 8})
    async with running_gateway(engine, config=config) as gateway:
        channel = gateway.open_episode("e0")
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=channel.api_key("writer"), max_retries=0)
        sampling = gateway.completions._sampling(channel, _request(), "writer")
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
    assert sampling.adapter is None and "unknown_agent" not in channel.counters
    assert [sample.policy for sample in channel.samples()] == [None]
    await engine.aclose()


def _request():
    from agenttune.gateway.protocol import parse_chat_request

    return parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
