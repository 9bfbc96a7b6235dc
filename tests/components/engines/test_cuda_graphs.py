"""The `hf` engine's CUDA-graph decode steps (engines/cuda_graphs.py).

On CPU the fixed-storage step runs unrecorded (`capture=False`): the step a graph would replay, on
the same storage, padding rows and full-width masked attention (grouped heads through torch's
grouped kernel; the CUDA arrangement is checked against it below). It must give the lean
pass's logits through row departures, reorders, joins and a wider storage, and leave the engine's
generations unchanged. The tests marked `cuda` capture and replay real graphs; they run only
where a GPU is (`python -m pytest tests/components/engines/test_cuda_graphs.py` on the GPU machine)."""

from __future__ import annotations

import asyncio
import copy

import pytest
from lean_models import left_padded, random_model

from agenttune.components.engines import cuda_graphs
from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.cuda_graphs import GraphedDecoder, row_bucket
from agenttune.components.engines.hf import HFEngine
from agenttune.components.engines.lean_decoder import LeanDecoder, grouped_decode_attention

cuda = pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA GPU")


def test_rows_run_in_buckets():
    assert [row_bucket(rows, 128) for rows in (1, 2, 3, 5, 8, 9, 16, 17, 100, 128)] == \
        [1, 2, 4, 8, 8, 16, 16, 32, 112, 128]
    assert row_bucket(20, 24) == 24  # never past the storage's rows


def test_grouped_decode_attention_is_repeated_heads_attention():
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(3, 6, 1, 8, generator=generator)
    keys, values = torch.randn(3, 2, 10, 8, generator=generator), torch.randn(3, 2, 10, 8, generator=generator)
    mask = torch.rand(3, 1, 1, 10, generator=generator) > 0.3
    mask[:, ..., -1] = True
    expected = F.scaled_dot_product_attention(queries, keys.repeat_interleave(3, 1), values.repeat_interleave(3, 1),
                                              attn_mask=mask, scale=0.3)
    assert torch.allclose(grouped_decode_attention(queries, keys, values, mask, 0.3), expected, atol=1e-6)


class Pair:
    """The same batch decoded by the lean pass and by the fixed-storage step, side by side."""

    def __init__(self, model, prompts, *, max_rows=8):
        import torch

        self.lean, self.graphed = LeanDecoder(model), GraphedDecoder(LeanDecoder(model), max_rows, capture=False)
        input_ids, self.attention, positions = left_padded(prompts)
        self.caches = [self.lean.new_cache(), self.lean.new_cache()]
        self.logits = self.lean.forward(input_ids, self.attention, positions, self.caches[0])
        self.lean.forward(input_ids, self.attention, positions, self.caches[1])
        self.positions = positions[:, -1:] + 1
        self.torch = torch

    def step(self):
        """One greedy decode step through both; checks they agree."""
        torch = self.torch
        tokens = self.logits.argmax(-1)[:, None]
        self.attention = torch.cat([self.attention, self.attention.new_ones((len(tokens), 1))], dim=1)
        lean = self.lean.forward(tokens, self.attention, self.positions, self.caches[0])
        graphed = self.graphed.forward(tokens, self.attention, self.positions, self.caches[1])
        assert torch.allclose(graphed, lean, atol=1e-4), float((graphed - lean).abs().max())
        assert self.caches[1].length == self.caches[0].length
        self.logits, self.positions = lean, self.positions + 1

    def select(self, rows):
        index = self.torch.tensor(rows)
        for cache in self.caches:
            cache.select(rows, index)
        self.logits, self.attention, self.positions = self.logits[index], self.attention[index], self.positions[index]

    def join(self, prompt):
        import torch.nn.functional as F

        torch = self.torch
        input_ids, attention, positions = left_padded([prompt])
        new_caches = [self.lean.new_cache(), self.lean.new_cache()]
        new_logits = [self.lean.forward(input_ids, attention, positions, cache) for cache in new_caches]
        for cache, new_cache in zip(self.caches, new_caches, strict=True):
            cache.join(new_cache)
        width = max(self.attention.shape[1], attention.shape[1])
        self.attention = torch.cat([F.pad(self.attention, [width - self.attention.shape[1], 0]),
                                    F.pad(attention, [width - attention.shape[1], 0])])
        self.logits = torch.cat([self.logits, new_logits[0]])
        self.positions = torch.cat([self.positions, positions[:, -1:] + 1])


def test_a_cache_trimmed_on_the_left_moves_back_into_the_storage_it_views():
    """After the engine drops columns no row attends (`LeanCache.trim`), the cache views the storage
    further right: the next step copies it back to column 0 (overlapping regions) and agrees."""
    import torch

    model = random_model("qwen2")
    tokens = torch.randint(1, 97, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.inference_mode():
        pair = Pair(model, [tokens[20:24], tokens[24:30], tokens[:20]])
        for _ in range(2):
            pair.step()
        storage = pair.graphed.storage
        assert storage.holds(pair.caches[1])
        pair.select([0, 1])  # the 20-token row leaves (the others stay in the storage's rows) ...
        assert storage.holds(pair.caches[1])
        assert int(pair.attention.any(0).int().argmax()) == 14  # ... and columns 0-13 are padding
        for cache in pair.caches:
            cache.trim(14)
        pair.attention = pair.attention[:, 14:]
        assert not storage.holds(pair.caches[1])
        for _ in range(3):
            pair.step()
        assert pair.graphed.storage is storage and storage.holds(pair.caches[1])
        assert pair.caches[1].length == pair.caches[0].length == 22 - 14 + 3


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "llama"])
def test_fixed_storage_steps_match_the_lean_pass_through_departures_joins_and_a_wider_storage(
        architecture, monkeypatch):
    import torch

    monkeypatch.setattr(cuda_graphs, "MIN_COLUMNS", 16)  # small enough to outgrow within the test
    model = random_model(architecture)
    prompts = torch.randint(1, 97, (3, 11), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        pair = Pair(model, [prompts[0][:5], prompts[1][:9], prompts[2][:2]])
        for _ in range(3):  # 3 rows run in the 4-row graph: one padding row
            pair.step()
        storage = pair.graphed.storage
        assert storage.columns == 16 and storage.holds(pair.caches[1])
        pair.select([0, 2])  # row 1 leaves, row 2 moves into its place: in the storage, no copy
        assert storage.holds(pair.caches[1])
        pair.step()
        pair.select([1, 0])  # a reorder takes new buffers: the next step copies them back in
        assert not storage.holds(pair.caches[1])
        pair.step()
        assert storage.holds(pair.caches[1])
        pair.join(torch.randint(1, 97, (14,), generator=torch.Generator().manual_seed(2)).tolist())
        for _ in range(4):  # the context passes 16 columns: a 32-column storage takes the rows over
            pair.step()
        assert pair.graphed.storage is not storage and pair.graphed.storage.columns == 32
        assert pair.graphed.graph_steps == 9


def test_a_storage_that_does_not_fit_leaves_the_steps_to_the_lean_pass(monkeypatch):
    import torch

    monkeypatch.setattr(cuda_graphs, "free_memory", lambda device: 1024.0)  # what a full GPU would report
    with torch.inference_mode():
        pair = Pair(random_model("qwen2"), [[5, 6, 7], [8, 9]])
        for _ in range(2):
            pair.step()
    assert pair.graphed.storage is None and pair.graphed.graph_steps == 0


def test_a_step_that_cannot_be_recorded_falls_back_to_the_lean_pass(monkeypatch):
    import structlog.testing
    import torch

    def unrecordable(self, rows):
        raise RuntimeError("operation not permitted when stream is capturing")

    with torch.inference_mode():
        pair = Pair(random_model("qwen2"), [[5, 6, 7], [8, 9]])
        pair.step()
        monkeypatch.setattr(GraphedDecoder, "_step", unrecordable)
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):  # each checked against the lean pass
                pair.step()
    assert pair.graphed.failed and pair.graphed.graph_steps == 1
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == [
        "hf engine: a decode step could not be recorded as a CUDA graph; decoding without graphs (slower). "
        "Set engine.cuda_graphs: false to skip the attempt."]


def test_replaced_weights_drop_the_graphs_and_updates_in_place_keep_them():
    import torch

    model = random_model("qwen2")
    with torch.inference_mode():
        pair = Pair(model, [[5, 6, 7], [8, 9]])
        pair.step()
    graphed = pair.graphed
    graphed.graphs[2] = "a graph"  # what a capture would have left (CPU records none)

    def next_batch():
        with torch.inference_mode():
            cache = graphed.new_cache()
            graphed.decoder.forward(torch.tensor([[3, 4]]), torch.ones(1, 2), torch.tensor([[0, 1]]), cache)
            graphed.forward(torch.tensor([[5]]), torch.ones(1, 3), torch.tensor([[2]]), cache)

    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)  # an optimizer step: the same tensors, new values
    next_batch()
    assert 2 in graphed.graphs
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # a reloaded weight
    next_batch()
    assert graphed.graphs == {}


def test_engine_generations_are_the_same_on_the_fixed_storage(tiny_model, tiny_tokenizer):
    """Greedy and seeded requests, several at once (shared prompts, different lengths), give the
    same tokens and logprobs with the engine's decode steps on the fixed storage."""
    prompts = [tiny_tokenizer.encode(text) for text in ("What is 2 + 3?", "Name a colour.", "What is 2 + 3?")]
    samplings = [SamplingParams(temperature=0.0, max_tokens=12), SamplingParams(temperature=1.0, max_tokens=9, seed=4),
                 SamplingParams(temperature=0.7, max_tokens=15, seed=9)]

    def run(graphed: bool):
        engine = HFEngine(tiny_model, tiny_tokenizer, cuda_graphs=False)
        if graphed:  # what cuda_graphs does on a GPU, unrecorded
            engine._decoder = GraphedDecoder(engine._decoder, engine.max_batch_size, capture=False)

        async def generate():
            try:
                return await asyncio.gather(*(engine.generate(prompt, sampling)
                                              for prompt, sampling in zip(prompts, samplings, strict=True)))
            finally:
                await engine.aclose()

        return asyncio.run(generate()), engine

    (plain, plain_engine), (graphed, graphed_engine) = run(False), run(True)
    counts = graphed_engine.counters()  # every forward after a prefill ran on the storage
    assert counts["graph_steps"] == counts["decode_steps"] - len(graphed_engine.batch_sizes) > 0
    assert plain_engine.counters()["graph_steps"] == 0
    for one, other in zip(plain, graphed, strict=True):
        assert one.token_ids == other.token_ids
        assert max(abs(a - b) for a, b in zip(one.logprobs, other.logprobs, strict=True)) < 1e-4


@cuda
def test_cuda_graph_replays_give_the_eager_generations_on_a_gpu(tiny_model, tiny_tokenizer):
    """On a GPU (float32): the engine with recorded graphs, several concurrent requests and a join,
    generates what it generates launching every kernel."""
    model = copy.deepcopy(tiny_model).to("cuda")  # (the fixture's model stays on the CPU for other tests)
    prompts = [tiny_tokenizer.encode(f"What is {i} + {2 * i}?") for i in range(5)]

    def run(graphs: bool):
        engine = HFEngine(model, tiny_tokenizer, cuda_graphs=graphs)

        async def generate():
            try:
                first = [engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=20)) for prompt in prompts[:4]]
                started = asyncio.gather(*first)
                while not engine.decode_steps:
                    await asyncio.sleep(0.001)
                late = await engine.generate(prompts[4], SamplingParams(temperature=1.0, max_tokens=20, seed=3))
                return [*await started, late]
            finally:
                await engine.aclose()

        return asyncio.run(generate()), engine

    (eager, _), (graphed, graphed_engine) = run(False), run(True)
    assert isinstance(graphed_engine._decoder, GraphedDecoder) and graphed_engine.counters()["graph_steps"] > 0
    assert graphed_engine._decoder.graphs  # recorded, not only stepped
    for one, other in zip(eager, graphed, strict=True):
        assert one.token_ids == other.token_ids
        assert max(abs(a - b) for a, b in zip(one.logprobs, other.logprobs, strict=True)) < 1e-4
