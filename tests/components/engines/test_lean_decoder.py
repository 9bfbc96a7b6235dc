"""The `hf` engine's lean forward pass (engines/lean_decoder.py): the same logits as transformers' forward
on llama, qwen2, qwen3 and mistral, through left padding, decode steps, rows leaving and joining, and
LoRA adapters; the engine's generations do not change with it, and shared prompts are prefilled once."""

from __future__ import annotations

import asyncio
import copy

import pytest
import structlog.testing
from lean_models import left_padded, random_model, reference_logits

from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.hf import HFEngine
from agenttune.components.engines.lean_decoder import LeanDecoder


def ids(tokenizer, text):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
    return tokenizer.encode(prompt, add_special_tokens=False)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "mistral"])
def test_lean_logits_match_transformers_through_padding_decoding_select_and_join(architecture):
    import torch
    import torch.nn.functional as F

    model = random_model(architecture)
    assert LeanDecoder.supports(model)
    decoder = LeanDecoder(model)
    prompts = torch.randint(1, 97, (3, 11), generator=torch.Generator().manual_seed(1)).tolist()
    sequences = [prompts[0][:5], prompts[1][:9], prompts[2][:2]]
    with torch.inference_mode():
        input_ids, attention, positions = left_padded(sequences)
        cache = decoder.new_cache()
        logits = decoder.forward(input_ids, attention, positions, cache)
        assert torch.allclose(logits, reference_logits(model, sequences), atol=1e-4)

        def decode_step(logits, attention, positions):
            tokens = logits.argmax(-1)
            for sequence, token in zip(sequences, tokens.tolist(), strict=True):
                sequence.append(token)
            attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
            positions = positions[:, -1:] + 1
            logits = decoder.forward(tokens[:, None], attention, positions, cache)
            assert torch.allclose(logits, reference_logits(model, sequences), atol=1e-4)
            return logits, attention, positions

        for _ in range(4):
            logits, attention, positions = decode_step(logits, attention, positions)

        # Row 1 leaves and row 2 takes its place (the buffers are reused) ...
        keep = [0, 2]
        cache.select(keep, torch.tensor(keep))
        sequences[:] = [sequences[0], sequences[2]]
        logits, attention, positions = decode_step(logits[keep], attention[keep], positions[keep])
        # ... then the two swap places (new buffers), and a longer prompt joins in a fresh cache.
        keep = [1, 0]
        cache.select(keep, torch.tensor(keep))
        sequences[:] = [sequences[1], sequences[0]]
        logits, attention, positions = logits[keep], attention[keep], positions[keep]
        newcomer = torch.randint(1, 97, (17,), generator=torch.Generator().manual_seed(2)).tolist()
        new_ids, new_attention, new_positions = left_padded([newcomer])
        new_cache = decoder.new_cache()
        new_logits = decoder.forward(new_ids, new_attention, new_positions, new_cache)
        assert torch.allclose(new_logits, reference_logits(model, [newcomer]), atol=1e-4)
        cache.join(new_cache)
        width = max(attention.shape[1], new_attention.shape[1])
        attention = torch.cat([F.pad(attention, [width - attention.shape[1], 0]),
                               F.pad(new_attention, [width - new_attention.shape[1], 0])])
        sequences.append(newcomer)
        decode_step(torch.cat([logits, new_logits]), attention, torch.cat([positions, new_positions[:, -1:]]))


def test_sliding_windows_other_architectures_and_dispatched_models_run_transformers_forward(tiny_tokenizer):
    import torch
    import transformers

    assert not LeanDecoder.supports(random_model("mistral", sliding_window=8))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64)
    gpt2 = transformers.GPT2LMHeadModel(config).eval()
    assert not LeanDecoder.supports(gpt2)
    assert not HFEngine(gpt2, tiny_tokenizer).uses_lean_forward
    dispatched = random_model("llama")
    dispatched.model.layers[1].mlp._hf_hook = object()  # what accelerate's device_map / offloading leaves
    assert not LeanDecoder.supports(dispatched)


def test_lean_forward_uses_the_lora_adapter(tiny_model, tiny_tokenizer):
    import torch

    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "gate_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(copy.deepcopy(tiny_model), config).eval()
    assert LeanDecoder.supports(adapted)
    assert HFEngine(adapted, tiny_tokenizer).uses_lean_forward
    prompt = torch.tensor([ids(tiny_tokenizer, "What is the weather like today in Paris?")])
    with torch.inference_mode():
        attention = torch.ones_like(prompt)
        positions = torch.arange(prompt.shape[1])[None]
        lean = LeanDecoder(adapted).forward(prompt, attention, positions, LeanDecoder(adapted).new_cache())
        expected = adapted(prompt).logits[:, -1].float()
        base = tiny_model(prompt).logits[:, -1].float()
    assert torch.allclose(lean, expected, atol=1e-4)
    assert not torch.allclose(lean, base, atol=1e-2)


def test_a_model_the_lean_forward_does_not_reproduce_runs_transformers_forward(tiny_model, tiny_tokenizer):
    """An architecture variant the lean path does not know (here: a layer that scales its output)
    is caught by the engine's start-up comparison, not trusted; one it cannot run is left to transformers."""
    import types

    import torch

    variant = copy.deepcopy(tiny_model)
    layer = variant.model.layers[0]
    plain_forward = layer.forward
    layer.forward = types.MethodType(lambda self, *args, **kwargs: 2 * plain_forward(*args, **kwargs), layer)
    assert LeanDecoder.supports(variant)
    with structlog.testing.capture_logs() as logs:
        assert not HFEngine(variant, tiny_tokenizer).uses_lean_forward
    assert any("does not reproduce this model's logits" in entry["event"] for entry in logs)
    assert HFEngine(tiny_model, tiny_tokenizer).uses_lean_forward
    broken = copy.deepcopy(tiny_model)
    del broken.model.layers[0].self_attn.q_proj  # a variant whose layers the lean pass cannot even run
    broken.model.layers[0].self_attn.query = torch.nn.Linear(128, 128)
    with structlog.testing.capture_logs() as logs:
        assert not HFEngine(broken, tiny_tokenizer).uses_lean_forward
    assert any("fails on this model (AttributeError" in entry["event"] for entry in logs)


def test_in_bfloat16_the_start_up_check_takes_the_model_and_still_catches_a_variant(tiny_model, tiny_tokenizer):
    """16-bit rounding differs between the two passes (2.9 % of the logits' range on the H100 bench
    model): the model itself must pass, a layer that scales its output must not."""
    import types

    import torch

    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    assert HFEngine(model, tiny_tokenizer).uses_lean_forward
    layer = model.model.layers[0]
    plain_forward = layer.forward
    layer.forward = types.MethodType(lambda self, *args, **kwargs: 2 * plain_forward(*args, **kwargs), layer)
    assert not HFEngine(model, tiny_tokenizer).uses_lean_forward


async def test_a_long_generation_grows_the_cache_and_matches_transformers_forward(tiny_model, tiny_tokenizer):
    """Past the cache's 64 spare columns the lean cache reallocates; the tokens must not change."""
    import torch

    prompt = ids(tiny_tokenizer, "1 2 3")
    greedy = SamplingParams(temperature=0, max_tokens=150)
    generations = []
    for lean in (True, False):
        engine = HFEngine(tiny_model, tiny_tokenizer, lean_forward=lean)
        generations.append(await engine.generate(prompt, greedy))
        await engine.aclose()
    assert len(generations[0].token_ids) > 70  # enough to pass the first reallocation
    assert generations[0].token_ids == generations[1].token_ids
    assert torch.allclose(torch.tensor(generations[0].logprobs), torch.tensor(generations[1].logprobs), atol=1e-4)


@pytest.mark.parametrize("lean", [True, False])
def test_trimmed_padding_columns_keep_the_logits_of_the_rows_that_stay_and_join(lean):
    """A long row leaves: the columns only it used are padding for every row left, and dropping them
    (`cache.trim`) must not change the logits of those rows or of a row joining afterwards."""
    import torch
    import torch.nn.functional as F

    from agenttune.components.engines.transformers_decoder import TransformersDecoder

    model = random_model("qwen3")
    decoder = LeanDecoder(model) if lean else TransformersDecoder(model)
    tokens = torch.randint(1, 97, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    sequences = [tokens[:30], tokens[30:34], tokens[34:40]]
    with torch.inference_mode():
        input_ids, attention, positions = left_padded(sequences)
        cache = decoder.new_cache()
        logits, positions = decoder.forward(input_ids, attention, positions, cache), positions[:, -1:] + 1

        def decode_step(logits, attention, positions):
            tokens = logits.argmax(-1)
            for sequence, token in zip(sequences, tokens.tolist(), strict=True):
                sequence.append(token)
            attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
            logits = decoder.forward(tokens[:, None], attention, positions, cache)
            assert torch.allclose(logits, reference_logits(model, sequences), atol=1e-4)
            return logits, attention, positions + 1

        for _ in range(2):
            logits, attention, positions = decode_step(logits, attention, positions)
        keep = [1, 2]  # the 30-token row leaves; the others started at column 24
        cache.select(keep, torch.tensor(keep))
        sequences[:] = [sequences[1], sequences[2]]
        logits, attention, positions = logits[keep], attention[keep], positions[keep]
        assert int(attention.any(0).int().argmax()) == 24
        cache.trim(24)
        attention = attention[:, 24:]
        for _ in range(2):
            logits, attention, positions = decode_step(logits, attention, positions)
        newcomer = tokens[:17]  # longer than the trimmed rows: they are left-padded to it
        new_ids, new_attention, new_positions = left_padded([newcomer])
        new_cache = decoder.new_cache()
        new_logits = decoder.forward(new_ids, new_attention, new_positions, new_cache)
        cache.join(new_cache)
        width = max(attention.shape[1], new_attention.shape[1])
        attention = torch.cat([F.pad(attention, [width - attention.shape[1], 0]),
                               F.pad(new_attention, [width - new_attention.shape[1], 0])])
        sequences.append(list(newcomer))
        logits, positions = torch.cat([logits, new_logits]), torch.cat([positions, new_positions[:, -1:] + 1])
        for _ in range(2):
            logits, attention, positions = decode_step(logits, attention, positions)


@pytest.mark.parametrize("lean_forward", [True, False])
async def test_the_engine_drops_the_columns_of_rows_gone_and_generates_the_same_tokens(
        tiny_model, tiny_tokenizer, lean_forward, monkeypatch):
    """A long prompt that finishes at once leaves a batch of short ones: its columns are trimmed
    from the cache, and the short prompts' greedy tokens and log-probs are those of an engine that
    keeps every column."""
    import torch

    from agenttune.components.engines import hf

    long_prompt = ids(tiny_tokenizer, " ".join(str(number) for number in range(60)))
    short = [ids(tiny_tokenizer, text) for text in ("Hello", "1 2 3", "What is 6 times 7?")]
    assert len(long_prompt) - max(len(prompt) for prompt in short) >= 2 * hf.MIN_TRIMMED_COLUMNS

    async def generate() -> tuple[list, float]:
        engine = HFEngine(tiny_model, tiny_tokenizer, lean_forward=lean_forward, batch_wait_ms=20)
        generations = await asyncio.gather(engine.generate(long_prompt, SamplingParams(temperature=0, max_tokens=1)),
                                           *[engine.generate(prompt, SamplingParams(temperature=0, max_tokens=40))
                                             for prompt in short])
        assert list(engine.batch_sizes) == [4]
        trimmed = engine.counters()["trimmed_columns"]
        await engine.aclose()
        return generations[1:], trimmed

    trimmed_run, trimmed = await generate()
    assert trimmed >= len(long_prompt) - max(len(prompt) for prompt in short)
    monkeypatch.setattr(hf, "MIN_TRIMMED_COLUMNS", 1 << 30)
    kept_run, kept = await generate()
    assert kept == 0
    for generation, reference in zip(trimmed_run, kept_run, strict=True):
        assert generation.token_ids == reference.token_ids
        assert torch.allclose(torch.tensor(generation.logprobs), torch.tensor(reference.logprobs), atol=1e-5)


async def test_under_steady_traffic_the_cache_stays_as_wide_as_its_rows_need(tiny_model, tiny_tokenizer, monkeypatch):
    """Clients that send their next request as soon as the last one returns keep one batch alive for
    hundreds of steps. Each step must attend over about its rows' own length, not over every column
    the batch has had since it started (which grows by one a step for as long as traffic lasts)."""
    from agenttune.components.engines import hf

    prompts = [ids(tiny_tokenizer, text) for text in ("Hello", "1 2 3", "What is 6 times 7?", "Paris", "2 + 2")]

    async def client(engine, number):
        for request in range(30):
            sampling = SamplingParams(temperature=1.0, max_tokens=4 + number, seed=100 * number + request)
            await engine.generate(prompts[(number + request) % len(prompts)], sampling)

    async def columns_per_step() -> tuple[float, dict]:
        engine = HFEngine(tiny_model, tiny_tokenizer)
        await asyncio.gather(*[client(engine, number) for number in range(8)])
        counted = engine.counters()
        await engine.aclose()
        return counted["columns"] / counted["decode_steps"], counted

    trimmed, counted = await columns_per_step()
    assert counted["decode_steps"] >= 4 * counted["batches"]  # batches lived long enough to matter
    longest = max(len(prompt) for prompt in prompts) + 4 + 7  # a prompt and the largest budget
    assert trimmed <= hf.MIN_TRIMMED_COLUMNS + 2 * longest, counted
    monkeypatch.setattr(hf, "MIN_TRIMMED_COLUMNS", 1 << 30)
    kept, counted = await columns_per_step()
    assert kept > 2 * trimmed, (kept, trimmed, counted)


def test_rows_leaving_move_only_the_rows_that_fill_their_places():
    from agenttune.components.engines.hf import _filling_holes

    assert _filling_holes([0, 1, 2]) == [0, 1, 2]
    assert _filling_holes([0, 2, 3]) == [0, 3, 2]  # row 1 left: row 3 takes its place, row 2 stays
    assert _filling_holes([3, 4]) == [3, 4]
    assert _filling_holes([1, 4, 5]) == [4, 1, 5]
    assert sorted(_filling_holes([0, 2, 5, 6, 9])) == [0, 2, 5, 6, 9]


async def test_engine_greedy_generations_are_the_same_with_and_without_lean_forward(tiny_model, tiny_tokenizer):
    import torch

    prompts = [ids(tiny_tokenizer, text) for text in
               ["Hello", "What is the weather like today in Paris?", "1 2 3", "Natalia sold clips to 48 friends."]]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    generations = {}
    for lean in (True, False):
        engine = HFEngine(tiny_model, tiny_tokenizer, lean_forward=lean)
        assert engine.uses_lean_forward is lean
        generations[lean] = await asyncio.gather(*[engine.generate(prompt, greedy) for prompt in prompts])
        await engine.aclose()
    for fast, reference in zip(generations[True], generations[False], strict=True):
        assert fast.token_ids == reference.token_ids
        assert torch.allclose(torch.tensor(fast.logprobs), torch.tensor(reference.logprobs), atol=1e-4)


@pytest.mark.parametrize("lean_forward", [True, False])
async def test_shared_prompts_are_prefilled_once_and_sample_independently(tiny_model, tiny_tokenizer, lean_forward):
    import torch

    prompt = ids(tiny_tokenizer, "Natalia sold clips to 48 friends.")
    seeded = [SamplingParams(temperature=1.0, max_tokens=10, seed=seed) for seed in (1, 2, 3, 4)]
    engine = HFEngine(tiny_model, tiny_tokenizer, lean_forward=lean_forward)
    together = await asyncio.gather(*[engine.generate(prompt, sampling) for sampling in seeded])
    assert list(engine.batch_sizes) == [4]
    assert engine.prefilled_rows == 1
    await engine.aclose()
    for sampling, generation in zip(seeded, together, strict=True):
        engine = HFEngine(tiny_model, tiny_tokenizer, lean_forward=lean_forward)
        alone = await engine.generate(prompt, sampling)
        await engine.aclose()
        assert generation.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(generation.logprobs), torch.tensor(alone.logprobs), atol=1e-5)
    assert len({tuple(generation.token_ids) for generation in together}) >= 2


def test_repeated_key_value_heads_attend_as_grouped_ones():
    """On CUDA the lean pass repeats each key/value head for its query heads (the fused kernels take
    no grouped heads beside a mask); it must equal the grouped attention it replaces on CPU."""
    import torch
    import torch.nn.functional as F

    from agenttune.components.engines.lean_decoder import _repeat_heads

    torch.manual_seed(0)
    queries, keys, values = torch.randn(3, 8, 1, 16), torch.randn(3, 2, 10, 16), torch.randn(3, 2, 10, 16)
    mask = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., :4] = False  # a left-padded row
    grouped = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, enable_gqa=True)
    repeated = F.scaled_dot_product_attention(queries, _repeat_heads(keys, 8), _repeat_heads(values, 8), attn_mask=mask)
    assert torch.allclose(grouped, repeated, atol=1e-6)


@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (4, 4)])
def test_cpu_decode_attention_equals_torchs_attention(heads, kv_heads):
    """A CPU decode step attends through two batched products (`grouped_decode_attention`); grouped and
    plain heads, left padding and a strided key/value view (the cache's used columns) as in the pass."""
    import torch
    import torch.nn.functional as F

    from agenttune.components.engines.lean_decoder import attention_output

    torch.manual_seed(0)
    queries = torch.randn(3, heads, 1, 16)
    storage = torch.randn(2, 3, kv_heads, 24, 16)  # 24 columns, 10 of them used
    keys, values = storage[0, :, :, :10], storage[1, :, :, :10]
    mask = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., :4] = False
    mask[2, ..., 5:9] = False
    expected = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=0.25,
                                              enable_gqa=heads != kv_heads)
    output = attention_output(queries, keys, values, mask, 0.25)
    assert output.shape == expected.shape
    assert torch.allclose(output, expected, atol=1e-6)
    # A masked column holding a huge value must not leak in.
    keys[0, :, 0] = 1e4
    assert torch.allclose(attention_output(queries, keys, values, mask, 0.25)[0], expected[0], atol=1e-6)
