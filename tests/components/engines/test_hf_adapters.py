"""The `hf` engine serving several LoRA adapters (policies) at once: each row samples with its own."""

from __future__ import annotations

import asyncio

import pytest

from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.hf import HFEngine

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

ADAPTERS = ("writer", "critic")


@pytest.fixture
def two_adapters(tiny_model):
    """The tiny model with two adapters of random weights (B != 0), so each changes the logits its way."""
    torch.manual_seed(0)
    config = {"r": 4, "lora_alpha": 16, "target_modules": "all-linear", "init_lora_weights": False}
    model = peft.get_peft_model(tiny_model, peft.LoraConfig(**config), adapter_name=ADAPTERS[0])
    model.add_adapter(ADAPTERS[1], peft.LoraConfig(**config))
    return model.eval()


def own_logprobs(model, adapter, prompt_ids, token_ids):
    """The adapter's own forward pass over prompt + generation, alone (the reference)."""
    with torch.inference_mode():
        if adapter == "__base__":
            with model.disable_adapter():
                logits = model(torch.tensor([prompt_ids + token_ids])).logits[0].float()
        else:
            model.set_adapter(adapter)
            logits = model(torch.tensor([prompt_ids + token_ids])).logits[0].float()
    picked = torch.log_softmax(logits, -1)[len(prompt_ids) - 1:-1]
    return picked.gather(1, torch.tensor(token_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("lean_forward", [True, False])
async def test_each_row_samples_with_its_adapter_in_one_mixed_batch(two_adapters, tiny_tokenizer, lean_forward):
    engine = HFEngine(two_adapters, tiny_tokenizer, max_batch_size=16, lean_forward=lean_forward)
    assert engine.adapter_names == ADAPTERS
    prompt_ids = tiny_tokenizer.encode("Natalia sold clips to 48 friends.", add_special_tokens=False)
    other_ids = tiny_tokenizer.encode("1 2 3", add_special_tokens=False)
    requests = [(adapter, prompt, seed) for seed, (adapter, prompt) in enumerate(
        (adapter, prompt) for adapter in (*ADAPTERS, "__base__") for prompt in (prompt_ids, other_ids, prompt_ids))]
    generations = await asyncio.gather(*[
        engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12, seed=seed, adapter=adapter))
        for adapter, prompt, seed in requests])
    assert engine.counters()["batches"] == 1  # all nine rows, three adapters, decoded together
    # (identical prompts of one adapter prefill once; the same prompt under another adapter does not)
    assert engine.prefilled_rows == 6
    for (adapter, prompt, _), generation in zip(requests, generations, strict=True):
        expected = own_logprobs(two_adapters, adapter, prompt, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, rtol=0, atol=1e-5), adapter
    # the adapters really differ: the writer's logprobs are not the critic's for the same tokens
    writer = generations[0]
    critic_view = own_logprobs(two_adapters, "critic", prompt_ids, writer.token_ids)
    assert not torch.allclose(torch.tensor(writer.logprobs), critic_view, atol=1e-3)
    await engine.aclose()


async def test_an_asynchronous_engines_copy_follows_every_adapter(two_adapters, tiny_tokenizer):
    """Asynchronous training samples from a copy of the trained model (backbones/local/loop.py's
    rollout_model); after an update, sync_weights must bring every adapter's new weights into it."""
    from agenttune.backbones.local.loop import rollout_model

    copy = rollout_model(two_adapters, 1)
    engine = HFEngine(copy, tiny_tokenizer)
    with torch.no_grad():  # the update: both adapters move
        for name, parameter in two_adapters.named_parameters():
            if "lora_" in name:
                parameter.add_(torch.randn_like(parameter))
    prompt_ids = tiny_tokenizer.encode("Natalia sold clips to 48 friends.", add_special_tokens=False)

    async def sample() -> list:
        return await asyncio.gather(*[engine.generate(prompt_ids, SamplingParams(
            temperature=1.0, max_tokens=12, seed=3, adapter=adapter)) for adapter in ADAPTERS])

    before = await sample()  # the copy's old weights: not the trained model's
    assert not torch.allclose(torch.tensor(before[0].logprobs),
                              own_logprobs(two_adapters, ADAPTERS[0], prompt_ids, before[0].token_ids), atol=1e-3)
    await engine.sync_weights(two_adapters, 1)
    for adapter, generation in zip(ADAPTERS, await sample(), strict=True):
        expected = own_logprobs(two_adapters, adapter, prompt_ids, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, rtol=0, atol=1e-5), adapter
        assert generation.versions == [1] * len(generation.token_ids)
    await engine.aclose()


async def test_a_model_without_adapters_serves_none(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    assert engine.adapter_names == ()
    await engine.aclose()
