"""The `hf` engine on the tiny model: exact sampling, batching of concurrent requests, sharing weights."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.hf import HFEngine
from agenttune.registry.resolution import build_engine
from agenttune.testing.gateways import running_gateway, tiny_config


@pytest.fixture
def prompts(tiny_tokenizer):
    texts = ["Hello", "What is the weather like today in Paris?", "1 2 3", "Natalia sold clips to 48 friends."]
    return [tiny_tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False) for text in texts]


def ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def model_logprobs(model, prompt_ids, token_ids, *, temperature=1.0):
    """What the model itself gives `token_ids` after `prompt_ids`, at `temperature`: the reference."""
    import torch

    logits = model(torch.tensor([prompt_ids + token_ids])).logits[0].float() / temperature
    return torch.log_softmax(logits, -1)[len(prompt_ids) - 1:-1].gather(1, torch.tensor(token_ids)[:, None]).squeeze(1)


async def test_greedy_matches_transformers_generate_alone_and_in_a_padded_batch(tiny_model, tiny_tokenizer, prompts):
    import torch

    engine = HFEngine(tiny_model, tiny_tokenizer)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    batched = await asyncio.gather(*[engine.generate(ids(tiny_tokenizer, p), greedy) for p in prompts])
    assert list(engine.batch_sizes) == [len(prompts)]  # one left-padded batch of different lengths
    assert engine.counters()["batches"] == 1
    for prompt, generation in zip(prompts, batched, strict=True):
        prompt_ids = ids(tiny_tokenizer, prompt)
        reference = tiny_model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)[0, len(prompt_ids):].tolist()
        assert generation.token_ids == reference[: len(generation.token_ids)]
        expected = model_logprobs(tiny_model, prompt_ids, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)
    await engine.aclose()


async def test_sampled_logprobs_are_temperature_scaled(tiny_model, tiny_tokenizer, prompts):
    import torch

    engine = HFEngine(tiny_model, tiny_tokenizer)
    prompt_ids = ids(tiny_tokenizer, prompts[0])
    generation = await engine.generate(prompt_ids, SamplingParams(temperature=0.7, max_tokens=8, seed=3))
    expected = model_logprobs(tiny_model, prompt_ids, generation.token_ids, temperature=0.7)
    assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)
    await engine.aclose()


async def test_seeds_reproduce_and_top_k_1_is_greedy(tiny_model, tiny_tokenizer, prompts):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    prompt_ids = ids(tiny_tokenizer, prompts[1])
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=11)
    first, second, other = await asyncio.gather(engine.generate(prompt_ids, seeded),
                                                engine.generate(prompt_ids, seeded),
                                                engine.generate(prompt_ids, SamplingParams(max_tokens=16, seed=12)))
    assert first.token_ids == second.token_ids != other.token_ids
    top1, greedy = await asyncio.gather(
        engine.generate(prompt_ids, SamplingParams(temperature=1.0, top_k=1, max_tokens=10)),
        engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=10)))
    assert top1.token_ids == greedy.token_ids
    nucleus = await engine.generate(prompt_ids, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=10))
    assert nucleus.token_ids == greedy.token_ids
    await engine.aclose()


async def test_stop_conditions(tiny_model, tiny_tokenizer, prompts):
    engine = HFEngine(tiny_model, tiny_tokenizer, max_model_len=60)
    prompt_ids = ids(tiny_tokenizer, prompts[0])
    greedy = await engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=30))
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 30
    stop_id = greedy.token_ids[4]
    first_at = greedy.token_ids.index(stop_id)
    by_id = await engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(stop_id,)))
    assert by_id.finish_reason == "stop" and by_id.token_ids == greedy.token_ids[: first_at + 1]
    stop_text = tiny_tokenizer.decode(greedy.token_ids[6:8])
    by_text = await engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=30, stop=(stop_text,)))
    assert by_text.finish_reason == "stop" and stop_text in tiny_tokenizer.decode(by_text.token_ids)
    assert len(by_text.token_ids) <= 8
    long_prompt = (prompt_ids * 10)[:55]
    capped = await engine.generate(long_prompt, SamplingParams(temperature=0, max_tokens=30))
    assert capped.finish_reason == "length" and len(long_prompt) + len(capped.token_ids) == 60
    await engine.aclose()


@pytest.mark.slow
async def test_requests_arriving_during_a_batch_join_it(tiny_model, tiny_tokenizer, prompts):
    """Continuous batching: late requests join the running batch up to max_batch_size rows."""
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=16)
    sampling = SamplingParams(temperature=1.0, max_tokens=24)
    prompt_ids = ids(tiny_tokenizer, prompts[2])
    first = [asyncio.create_task(engine.generate(prompt_ids, sampling)) for _ in range(10)]
    while not engine.decode_steps:  # until the first batch decodes (a fixed sleep may outlast it)
        await asyncio.sleep(0.001)
    later = [asyncio.create_task(engine.generate(prompt_ids, sampling)) for _ in range(30)]
    results = await asyncio.gather(*first, *later)
    assert all(len(result.token_ids) >= 1 for result in results)
    assert engine.batch_sizes[0] == 10 and engine.joined >= 6
    assert sum(engine.batch_sizes) + engine.joined == 40 and engine.counters()["batches"] == len(engine.batch_sizes)
    # decode_steps (rows decoded, requests in flight): the batch filled up to its cap while requests waited
    assert engine.decode_steps[0][0] == 10 and max(rows for rows, _ in engine.decode_steps) == 16
    assert all(rows <= min(in_flight, 16) for rows, in_flight in engine.decode_steps)
    await engine.aclose()


async def test_rows_that_join_a_running_batch_decode_exactly_as_alone(tiny_model, tiny_tokenizer, prompts):
    """A joined row's KV cache is left-padded to the batch's (or the batch's to it): greedy tokens and
    logprobs must be those of the model alone, for shorter and longer prompts than the batch's."""
    import torch

    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=8, batch_wait_ms=0)
    greedy = SamplingParams(temperature=0, max_tokens=16)
    early = [asyncio.create_task(engine.generate(ids(tiny_tokenizer, prompts[1]), greedy)) for _ in range(2)]
    while not engine.decode_steps:
        await asyncio.sleep(0.001)
    late_prompts = [prompts[0], prompts[3], prompts[2], prompts[1] + " More words." * 12]  # wider than the batch by then
    late = [asyncio.create_task(engine.generate(ids(tiny_tokenizer, text), greedy)) for text in late_prompts]
    results = await asyncio.gather(*early, *late)
    assert engine.joined >= 1
    for text, generation in zip([prompts[1]] * 2 + late_prompts, results, strict=True):
        prompt_ids = ids(tiny_tokenizer, text)
        reference = tiny_model.generate(torch.tensor([prompt_ids]), max_new_tokens=16, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)[0, len(prompt_ids):].tolist()
        assert generation.token_ids == reference[: len(generation.token_ids)]
        expected = model_logprobs(tiny_model, prompt_ids, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)
    await engine.aclose()


async def test_the_engine_shares_the_model_object(tiny_model, tiny_tokenizer, prompts):
    """The local trainer updates the same weights in place; the next generation sees them."""
    import torch

    engine = build_engine(tiny_config(), tiny_tokenizer, model=tiny_model)
    assert engine.model is tiny_model
    prompt_ids = ids(tiny_tokenizer, prompts[0])
    greedy = SamplingParams(temperature=0, max_tokens=6)
    before = await engine.generate(prompt_ids, greedy)
    assert before.token_ids[0] != 0
    with torch.no_grad():
        tiny_model.model.norm.weight.zero_()  # every logit becomes 0: greedy picks token 0
    tiny_model.train()
    after = await engine.generate(prompt_ids, greedy)
    assert after.token_ids == [0] and after.finish_reason == "stop"  # token 0 is <|endoftext|>, a stop token
    assert tiny_model.training  # left as the trainer had it
    await engine.aclose()


async def test_cancelled_requests_leave_the_batch(tiny_model, tiny_tokenizer, prompts):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    prompt_ids = ids(tiny_tokenizer, prompts[0])
    doomed = asyncio.create_task(engine.generate(prompt_ids, SamplingParams(max_tokens=5000)))
    kept = asyncio.create_task(engine.generate(prompt_ids, SamplingParams(max_tokens=20)))
    await asyncio.sleep(0.05)
    doomed.cancel()
    assert len((await kept).token_ids) <= 20
    follow_up = await asyncio.wait_for(engine.generate(prompt_ids, SamplingParams(max_tokens=4)), timeout=30)
    assert len(follow_up.token_ids) <= 4
    await engine.aclose()


@pytest.mark.slow
async def test_hf_engine_behind_the_gateway_batches_concurrent_episodes(tiny_model, tiny_tokenizer):
    config = tiny_config(rollout={"max_response_length_in_one_turn": 16})
    engine = build_engine(config, tiny_tokenizer, model=tiny_model)
    async with running_gateway(engine, config=config) as gateway:
        async def episode(index: int):
            channel = gateway.open_episode(f"e{index}")
            client = openai.AsyncOpenAI(base_url="http://in-process/v1", api_key=channel.api_key(), max_retries=0,
                                        http_client=httpx.AsyncClient(transport=channel.async_transport()))
            messages = [{"role": "user", "content": f"Question {index}"}]
            for _ in range(2):
                reply = await client.chat.completions.create(model="m", messages=messages)
                messages += [reply.choices[0].message.model_dump(exclude_none=True),
                             {"role": "user", "content": "Go on"}]
            return channel

        channels = await asyncio.gather(*[episode(i) for i in range(24)])
    assert max(engine.batch_sizes) > 8  # concurrent episodes shared forward passes
    for channel in channels:
        [sample] = channel.samples()
        assert sample.num_calls == 2
        assert sum(sample.loss_mask) == channel.metrics()["generated_tokens"]
    await engine.aclose()


async def test_requests_trickling_in_together_share_one_batch(tiny_model, tiny_tokenizer, prompts):
    """A group's requests reach the engine one after another; batch_wait_ms lets them meet in one batch."""
    sampling = SamplingParams(temperature=1.0, max_tokens=4)
    prompt_ids = ids(tiny_tokenizer, prompts[2])

    async def trickle(engine: HFEngine, count: int = 12) -> None:
        tasks = []
        for _ in range(count):
            tasks.append(asyncio.create_task(engine.generate(prompt_ids, sampling)))
            await asyncio.sleep(0.001)  # the client and gateway of the next episode at work
        await asyncio.gather(*tasks)
        await engine.aclose()

    patient = HFEngine(tiny_model, tiny_tokenizer, batch_wait_ms=25, max_batch_wait_ms=1000)
    await trickle(patient)
    assert list(patient.batch_sizes) == [12]
    eager = HFEngine(tiny_model, tiny_tokenizer, batch_wait_ms=0)
    await trickle(eager)
    assert eager.batch_sizes[0] < 12 and sum(eager.batch_sizes) + eager.joined == 12


async def test_a_kv_cache_budget_sizes_the_batch(tiny_model, tiny_tokenizer, prompts):
    """max_batch_tokens: rows x the longest row's prompt + max_tokens stays within it; the rest wait and join."""
    prompt_ids = ids(tiny_tokenizer, prompts[2])
    sampling = SamplingParams(temperature=1.0, max_tokens=12)
    reserved = len(prompt_ids) + 12
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=64, max_batch_tokens=3 * reserved + 1)
    results = await asyncio.gather(*(engine.generate(prompt_ids, sampling) for _ in range(8)))
    assert all(result.token_ids for result in results)
    assert max(rows for rows, _ in engine.decode_steps) == 3 and engine.batch_sizes[0] == 3
    lone = HFEngine(tiny_model, tiny_tokenizer, max_batch_tokens=1)  # a request larger than the budget still runs
    assert (await lone.generate(prompt_ids, sampling)).token_ids
    await engine.aclose()
    await lone.aclose()


def test_the_kv_memory_fraction_only_applies_on_cuda(tiny_model, tiny_tokenizer):
    config = tiny_config(engine={"type": "hf", "kv_cache_memory_fraction": 0.5})
    engine = build_engine(config, tiny_tokenizer, model=tiny_model)
    assert engine.max_batch_tokens is None  # CPU: max_batch_size alone
    config = tiny_config(engine={"type": "hf", "max_batch_tokens": 4096})
    assert build_engine(config, tiny_tokenizer, model=tiny_model).max_batch_tokens == 4096


def test_the_decode_thread_takes_half_the_cores_beside_a_trainer(tiny_model, tiny_tokenizer, monkeypatch):
    """Beside a trainer in the same process (a shared model) the decode thread's intra-op team is
    half of torch's; serving alone (a model of its own) it is torch's; cpu_threads overrides both.
    An OpenMP team belongs to its thread: the caller's thread count does not change."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    monkeypatch.setattr("agenttune.components.engines.model_loading.load_model", lambda *args, **kwargs: tiny_model)
    before = torch.get_num_threads()
    shared = build_engine(tiny_config(), tiny_tokenizer, model=tiny_model)
    alone = build_engine(tiny_config(), tiny_tokenizer)
    chosen = build_engine(tiny_config(engine={"type": "hf", "cpu_threads": 3}), tiny_tokenizer, model=tiny_model)
    decode_threads = [engine._executor.submit(torch.get_num_threads).result() for engine in (shared, alone, chosen)]
    assert decode_threads == [max(1, before // 2), before, 3]
    assert torch.get_num_threads() == before
    with ThreadPoolExecutor(max_workers=1) as later:  # threads started afterwards begin with torch's count
        assert later.submit(torch.get_num_threads).result() == before


async def test_a_seeded_request_samples_the_same_alone_or_joining_a_busy_batch(tiny_model, tiny_tokenizer, prompts):
    seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=5)
    prompt_ids = ids(tiny_tokenizer, prompts[3])
    alone_engine = HFEngine(tiny_model, tiny_tokenizer)
    alone = await alone_engine.generate(prompt_ids, seeded)
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_wait_ms=0)
    busy = [asyncio.create_task(engine.generate(ids(tiny_tokenizer, prompts[1]), SamplingParams(max_tokens=40)))
            for _ in range(4)]
    while not engine.decode_steps:
        await asyncio.sleep(0.001)
    joined = await engine.generate(prompt_ids, seeded)
    await asyncio.gather(*busy)
    assert engine.joined == 1 and joined.token_ids == alone.token_ids
    await alone_engine.aclose()
    await engine.aclose()


async def test_a_cancelled_request_frees_its_slot_for_a_waiting_one(tiny_model, tiny_tokenizer, prompts):
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=2, batch_wait_ms=0)
    prompt_ids = ids(tiny_tokenizer, prompts[0])
    long = SamplingParams(temperature=0, max_tokens=400)  # (this greedy reply never reaches a stop token)
    doomed, busy = (asyncio.create_task(engine.generate(prompt_ids, long)) for _ in range(2))
    while not engine.decode_steps:
        await asyncio.sleep(0.001)
    waiting = asyncio.create_task(engine.generate(prompt_ids, SamplingParams(max_tokens=3)))
    await asyncio.sleep(0.02)
    doomed.cancel()
    assert len((await asyncio.wait_for(waiting, timeout=30)).token_ids) <= 3
    assert not busy.done() and engine.joined == 1  # it took the cancelled row's place in the running batch
    busy.cancel()
    await engine.aclose()


async def test_a_weight_update_mid_generation_is_recorded_per_token(tiny_model, tiny_tokenizer, prompts):
    """Asynchronous training: the engine samples from its own copy; an update lands between two decode
    steps, the request goes on with the new weights, and every token records the version that sampled it."""
    import copy

    import torch

    engine = HFEngine(copy.deepcopy(tiny_model).requires_grad_(False), tiny_tokenizer)
    prompt_ids = ids(tiny_tokenizer, prompts[1])
    greedy = SamplingParams(temperature=0, max_tokens=48, stop_token_ids=[])
    engine.update_weights(tiny_model, 0)  # a copy of the same weights: version 0
    alone = await engine.generate(prompt_ids, greedy)
    assert alone.versions == [0] * len(alone.token_ids)

    trained = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    received: list[int] = []
    generation = None
    async for item in engine.generate_stream(prompt_ids, greedy):
        if isinstance(item, list):
            received += item
            if len(received) == 3:
                await asyncio.to_thread(engine.update_weights, trained, 1)
        else:
            generation = item
    versions = generation.versions
    switch = versions.index(1)
    assert 3 <= switch < len(versions) and versions == [0] * switch + [1] * (len(versions) - switch)
    assert generation.token_ids[:switch] == alone.token_ids[:switch]  # the old weights, greedily, until the switch
    assert generation.token_ids != alone.token_ids  # then the new ones
    for mine, theirs in zip(engine.model.parameters(), trained.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert next(tiny_model.parameters()).requires_grad  # the trained model is left as it was
    await engine.aclose()


def test_a_weight_update_from_another_architecture_is_refused(tiny_model, tiny_tokenizer):
    import torch

    engine = HFEngine(tiny_model, tiny_tokenizer)
    with pytest.raises(ValueError, match="not a copy of the trained model"):
        engine.update_weights(torch.nn.Linear(2, 2), 1)


async def test_waiting_requests_are_served_by_priority_then_arrival(tiny_model, tiny_tokenizer, prompts):
    """Asynchronous training gives each group its admission number as priority: when requests queue for a
    full batch, the oldest group's are decoded first (the trainer waits for it), ties in arrival order."""
    engine = HFEngine(tiny_model, tiny_tokenizer, max_batch_size=1, batch_wait_ms=0)
    prompt_ids = ids(tiny_tokenizer, prompts[0])
    busy = asyncio.create_task(engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=40)))
    while not engine.decode_steps:
        await asyncio.sleep(0.001)
    finished: list[str] = []

    async def request(name: str, priority: int) -> None:
        await engine.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=2, priority=priority))
        finished.append(name)

    queued = []
    for name, priority in [("late group a", 2), ("late group b", 2), ("old group", 1), ("late group c", 2)]:
        queued.append(asyncio.create_task(request(name, priority)))
        await asyncio.sleep(0)  # arrival order
    await asyncio.gather(busy, *queued)
    assert finished == ["old group", "late group a", "late group b", "late group c"]
    await engine.aclose()
