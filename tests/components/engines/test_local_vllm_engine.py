"""The `vllm` engine around vLLM itself (no GPU here, and vLLM is not installed in the core tests).

What is tested: sampling parameters map onto vLLM's; vLLM's outputs become Generations (ids, the
sampled tokens' logprobs, finish reasons); the trainer's weights get vLLM's names (peft's wrapping
stripped, LoRA merged, the model left unmerged after); the colocated cycle (sleep before the update;
after it wake the weights, transfer, wake the KV cache, reset the prefix cache) runs in that order,
delivers the trainer's exact weights, and also runs before the first generation; asynchronous
training (vLLM never sleeps; an update lands in the middle of a stream: pause keeping requests,
load, preempt running requests, resume; the request goes on and every token records the version
that sampled it, also with a slow reader); the training loop's calls in both modes; config errors.

What stands in for vLLM: `AsyncLLM` (a recorder that "loads" weights by decoding the update payload;
`SteppedAsyncLLM` adds a scheduler the test steps token by token, with vLLM's pause, preemption and
weight-version labels) and the CUDA IPC handle (a registry key instead of a GPU memory handle). The
`vllm` nox session checks the same calls against the real package (tests/test_vllm_api.py).
"""

from __future__ import annotations

import asyncio
import base64
import pickle
import sys
import threading
import types
from dataclasses import dataclass, field

import pytest

from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.vllm_weights import vllm_weight_name, vllm_weights
from agenttune.errors import UserError

torch = pytest.importorskip("torch")


@dataclass
class Logprob:
    logprob: float


@dataclass
class Span:  # vLLM's WeightVersionSpan: output tokens [start, end) were sampled by weights labelled `version`
    version: str
    start: int
    end: int


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    weight_versions: list[Span] | None = None


@dataclass
class Output:
    outputs: list[Completion]


class StandInSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@dataclass
class Request:  # WeightTransferInitRequest / WeightTransferUpdateRequest
    init_info: dict | None = None
    update_info: dict | None = None


class FakeIPC:
    """CUDA IPC without a GPU: a handle is a key into this registry of the trainer's tensors."""

    def __init__(self):
        self.tensors: dict[int, torch.Tensor] = {}

    def share(self, tensor):
        self.tensors[id(tensor)] = tensor
        return "GPU-test", (id(tensor),)

    def open(self, handle):
        return self.tensors[handle["GPU-test"][0]]


@dataclass
class StandInAsyncLLM:
    """Records the calls the engine makes; `update_weights` loads what the payload points at."""

    ipc: FakeIPC
    completion: Completion | None = None
    reset_succeeds: bool = True
    calls: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    loaded: dict = field(default_factory=dict)

    async def generate(self, prompt, params, request_id):
        self.calls.append("generate")
        self.requests.append((prompt, params, request_id))
        yield Output([Completion(self.completion.token_ids[:1], None, None)])  # streaming partial
        yield Output([self.completion])

    async def sleep(self, level=1, mode="abort"):
        self.calls.append(("sleep", level))

    async def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))
        return True

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append(("reset_prefix_cache", reset_running_requests))
        return self.reset_succeeds

    async def init_weight_transfer_engine(self, request):
        self.calls.append(("init_weight_transfer_engine", request.init_info))

    async def start_weight_update(self):
        self.calls.append("start_weight_update")

    async def update_weights(self, request):
        info = request.update_info
        handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
        assert len(info["names"]) == len(info["dtype_names"]) == len(info["shapes"]) == len(handles)
        for name, dtype, shape, handle in zip(info["names"], info["dtype_names"], info["shapes"], handles,
                                              strict=True):
            tensor = self.ipc.open(handle)
            assert str(tensor.dtype) == f"torch.{dtype}" and list(tensor.shape) == shape
            self.loaded[name] = tensor.clone()  # vLLM's load_weights copies into its own parameters
        self.calls.append("update_weights")

    async def finish_weight_update(self, weight_version=None):
        self.calls.append("finish_weight_update")
        if weight_version is not None:
            self.label = weight_version  # what vLLM's engine core labels every later step's output with

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        self.calls.append(("pause_generation", mode, clear_cache))

    async def resume_generation(self):
        self.calls.append("resume_generation")


class SteppedAsyncLLM(StandInAsyncLLM):
    """vLLM's scheduling as far as a weight update among requests in flight goes, stepped by the test.

    `step()` is one engine step: each running request samples one token (100 + its position),
    labelled with the weight version set last, as vLLM's engine core labels each step's output.
    No step runs while paused (mode "keep"); mode "abort" would finish the running requests.
    Outputs are cumulative and wait for the reader in one slot per request, so a slow reader gets
    several steps merged (vLLM's RequestOutputCollector). `reset_prefix_cache(reset_running_requests=
    True)` preempts the running requests: their KV is recomputed at their next step, by the weights
    loaded then (`recomputed`); without it, a cache that running requests hold does not reset. The
    final output carries `weight_versions` spans when `spans` is set, as vLLM 0.33 builds them.
    """

    def __init__(self, ipc, *, max_tokens=6, spans=True):
        super().__init__(ipc)
        self.max_tokens, self.spans = max_tokens, spans
        self.label = "default"
        self.paused = False
        self.running: dict[str, dict] = {}
        self.recomputed: list[tuple[str, str]] = []

    async def generate(self, prompt, params, request_id):
        self.calls.append("generate")
        state = {"tokens": [], "labels": [], "slot": None, "ready": asyncio.Event(), "preempted": False}
        self.running[request_id] = state
        while True:
            await state["ready"].wait()
            state["ready"].clear()
            output, state["slot"] = state["slot"], None
            yield output
            if output.outputs[0].finish_reason is not None:
                return

    def step(self):
        if self.paused:
            return
        for request_id, state in list(self.running.items()):
            if state["preempted"]:
                self.recomputed.append((request_id, self.label))
                state["preempted"] = False
            state["tokens"].append(100 + len(state["tokens"]))
            state["labels"].append(self.label)
            self._deliver(request_id, state, "length" if len(state["tokens"]) == self.max_tokens else None)

    def _deliver(self, request_id, state, finish):
        spans = _spans(state["labels"]) if finish and self.spans else None
        state["slot"] = Output([Completion(list(state["tokens"]), None, finish, weight_versions=spans)])
        state["ready"].set()
        if finish:
            del self.running[request_id]

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        await super().pause_generation(mode=mode, clear_cache=clear_cache)
        if mode == "abort":
            for request_id, state in list(self.running.items()):
                self._deliver(request_id, state, "abort")
        self.paused = True

    async def resume_generation(self):
        await super().resume_generation()
        self.paused = False

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append(("reset_prefix_cache", reset_running_requests))
        if not reset_running_requests:
            return not self.running
        for state in self.running.values():
            state["preempted"] = True
        return True


def _spans(labels):
    spans = []
    for position, label in enumerate(labels):
        if spans and spans[-1].version == label:
            spans[-1].end = position + 1
        else:
            spans.append(Span(label, position, position + 1))
    return spans


async def settle():
    """Let the other tasks run up to their next real wait."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def stand_in_vllm(monkeypatch):
    weight_transfer = types.SimpleNamespace(WeightTransferInitRequest=lambda init_info: Request(init_info=init_info),
                                            WeightTransferUpdateRequest=lambda update_info: Request(
                                                update_info=update_info))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=StandInSamplingParams))
    monkeypatch.setitem(sys.modules, "vllm.sampling_params",
                        types.SimpleNamespace(StructuredOutputsParams=StandInSamplingParams))
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.base", weight_transfer)


def make_engine(completion=None, *, sleep_level=2, model=None):
    from agenttune.components.engines.vllm import VLLMEngine

    ipc = FakeIPC()
    return VLLMEngine(StandInAsyncLLM(ipc, completion), sleep_level=sleep_level, model=model, share=ipc.share)


def make_stepped_engine(*, spans=True, sleep_level=0, model=None):
    """Asynchronous training's engine: sleep level 0 (what `_sleep_level` gives asynchronous modes)."""
    from agenttune.components.engines.vllm import VLLMEngine

    ipc = FakeIPC()
    return VLLMEngine(SteppedAsyncLLM(ipc, spans=spans), sleep_level=sleep_level, model=model, share=ipc.share)


# -- requests and outputs -------------------------------------------------------------------------
async def test_generate_returns_the_sampled_ids_and_their_logprobs(stand_in_vllm):
    completion = Completion([5, 9, 2], [{5: Logprob(-0.5), 7: Logprob(-1.0)}, {9: Logprob(-0.25)}, {2: Logprob(-2.0)}],
                            "stop")
    engine = make_engine(completion)
    generation = await engine.generate([1, 2, 3], SamplingParams(temperature=0.7, top_k=-1, max_tokens=16,
                                                                   stop=("</x>",), seed=4), request_id="r1")
    assert generation.token_ids == [5, 9, 2]
    assert generation.logprobs == [-0.5, -0.25, -2.0]
    assert generation.finish_reason == "stop"
    prompt, params, request_id = engine.engine.requests[0]
    assert prompt == {"prompt_token_ids": [1, 2, 3]} and request_id == "r1"
    assert params.kwargs == {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_tokens": 16, "stop": ["</x>"],
                             "stop_token_ids": None, "seed": 4, "logprobs": 0}


async def test_aborted_requests_and_missing_logprobs(stand_in_vllm):
    engine = make_engine(Completion([4], None, "abort"))
    generation = await engine.generate([1], SamplingParams())
    assert generation.finish_reason == "abort" and generation.logprobs is None


async def test_a_guide_becomes_vllm_structured_outputs(stand_in_vllm):
    from agenttune.components.engines.base import Guide

    engine = make_engine(Completion([5], [{5: Logprob(-0.5)}], "stop"))
    await engine.generate([1], SamplingParams(guide=Guide("structural_tag", '{"type": "structural_tag"}')))
    params = engine.engine.requests[0][1]
    assert params.kwargs["structured_outputs"].kwargs == {"structural_tag": '{"type": "structural_tag"}'}


async def test_vllm_streams_new_token_ids_then_the_generation(stand_in_vllm):
    from agenttune.components.engines.base import Generation

    engine = make_engine(Completion([5, 9, 2], [{5: Logprob(-0.5)}, {9: Logprob(-0.25)}, {2: Logprob(-2.0)}], "stop"))
    events = [event async for event in engine.generate_stream([1, 2], SamplingParams())]
    assert events[:-1] == [[5], [9, 2]]  # the stand-in's partial output, then the rest
    assert isinstance(events[-1], Generation) and events[-1].token_ids == [5, 9, 2]


# -- weight names ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("trainer_name", "vllm_name"), [
    ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),  # full fine-tuning
    ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias", "model.layers.0.self_attn.q_proj.bias"),
    ("base_model.model.model.embed_tokens.weight", "model.embed_tokens.weight"),
    ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
    ("base_model.model.lm_head.modules_to_save.my_adapter.weight", "lm_head.weight"),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", None),
    ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
    ("base_model.model.model.layers.0.mlp.down_proj.lora_magnitude_vector.default.weight", None),  # DoRA
    ("base_model.model.lm_head.original_module.weight", None),
    ("model.layers.0.mlp.base_layer_norm.weight", "model.layers.0.mlp.base_layer_norm.weight"),  # not peft's
    ("model.lora_gate.weight", None),  # a module named lora_*: peft's naming, skipped as LoRA is
])
def test_trainer_names_become_vllm_names(trainer_name, vllm_name):
    assert vllm_weight_name(trainer_name) == vllm_name


def test_full_fine_tuning_sends_every_parameter_under_its_own_name(tiny_model):
    with vllm_weights(tiny_model) as weights:
        assert [name for name, _ in weights] == [name for name, _ in tiny_model.named_parameters()]
        assert all(tensor.data_ptr() == parameter.data_ptr()  # shared, not copied
                   for (_, tensor), (_, parameter) in zip(weights, tiny_model.named_parameters(), strict=True))


def test_lora_is_sent_merged_under_the_base_models_names_and_unmerged_after(tiny_model):
    peft = pytest.importorskip("peft")
    base_names = [name for name, _ in tiny_model.named_parameters()]
    policy = peft.get_peft_model(tiny_model, peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    layer = policy.get_base_model().model.layers[0].self_attn.q_proj
    before = layer.base_layer.weight.detach().clone()
    expected = before + layer.get_delta_weight("default")
    with vllm_weights(policy) as weights:
        names = [name for name, _ in weights]
        sent = dict(weights)["model.layers.0.self_attn.q_proj.weight"].clone()
    assert names == base_names
    torch.testing.assert_close(sent, expected)
    assert not torch.allclose(sent, before), "the adapter was not merged in"
    torch.testing.assert_close(layer.base_layer.weight.detach(), before)  # unmerged again
    assert not layer.merged


# -- the colocated cycle --------------------------------------------------------------------------
async def test_sleep_during_the_update_then_wake_load_and_reset(stand_in_vllm, tiny_model):
    engine = make_engine(Completion([5], [{5: Logprob(-0.5)}], "stop"))
    await engine.release_memory()
    await engine.release_memory()  # already asleep: no second sleep
    with torch.no_grad():
        tiny_model.model.layers[0].self_attn.q_proj.weight.add_(1.0)  # the optimizer step
    await engine.sync_weights(tiny_model, 1)
    assert engine.engine.calls == [
        ("sleep", 2),
        ("wake_up", ["weights"]),
        ("init_weight_transfer_engine", {"packed": False}),
        "start_weight_update", "update_weights", "finish_weight_update",
        ("wake_up", ["kv_cache"]),
        ("reset_prefix_cache", True),
    ]
    loaded = engine.engine.loaded
    assert list(loaded) == [name for name, _ in tiny_model.named_parameters()]
    for name, parameter in tiny_model.named_parameters():
        torch.testing.assert_close(loaded[name], parameter.detach())
    assert engine.policy_version == 1 and engine.engine.label == "1"

    engine.engine.calls.clear()
    await engine.release_memory()
    await engine.sync_weights(tiny_model, 2)  # the transfer engine is set up once
    assert ("init_weight_transfer_engine", {"packed": False}) not in engine.engine.calls
    assert engine.policy_version == 2 and engine.engine.label == "2"


async def test_without_sleep_mode_the_update_pauses_keeping_requests_then_resumes(stand_in_vllm, tiny_model):
    engine = make_engine(sleep_level=0)
    await engine.release_memory()
    await engine.sync_weights(tiny_model, 1)
    assert engine.engine.calls == [
        ("pause_generation", "keep", False),
        ("init_weight_transfer_engine", {"packed": False}),
        "start_weight_update", "update_weights", "finish_weight_update",
        ("reset_prefix_cache", True),
        "resume_generation",
    ]
    assert engine.engine.loaded and engine.policy_version == 1


async def test_the_trainers_weights_load_before_the_first_generation(stand_in_vllm, tiny_model):
    """A resumed or warmed-up policy differs from the checkpoint vLLM read from disk."""
    engine = make_engine(Completion([5], [{5: Logprob(-0.5)}], "stop"), model=tiny_model)
    await engine.generate([1], SamplingParams())
    await engine.generate([1], SamplingParams())
    calls = engine.engine.calls
    assert calls.index("update_weights") < calls.index("generate") and calls.count("update_weights") == 1


async def test_a_generation_after_release_without_an_update_wakes_vllm_fully(stand_in_vllm):
    engine = make_engine(Completion([5], [{5: Logprob(-0.5)}], "stop"))
    await engine.release_memory()
    await engine.generate([1], SamplingParams())
    assert engine.engine.calls == [("sleep", 2), ("wake_up", None), "generate"]


async def test_a_prefix_cache_that_does_not_reset_is_an_error_not_stale_blocks(stand_in_vllm, tiny_model):
    engine = make_engine(sleep_level=0)
    engine.engine.reset_succeeds = False
    with pytest.raises(RuntimeError, match="prefix cache"):
        await engine.sync_weights(tiny_model, 1)
    assert "resume_generation" not in engine.engine.calls  # half-updated weights must not sample
    assert engine.policy_version == 0


# -- asynchronous training: an update among requests in flight ------------------------------------
async def next_chunk(stream, llm, steps=1):
    """Read the stream's next event while the engine takes `steps` steps."""
    reading = asyncio.ensure_future(stream.__anext__())
    await settle()  # the reader waits for vLLM's output
    for _ in range(steps):
        llm.step()
    return await reading


@pytest.mark.parametrize("spans", [True, False], ids=["vllm-spans", "stamped-as-chunks-arrive"])
async def test_an_update_mid_stream_lets_the_request_go_on_with_the_new_weights(stand_in_vllm, tiny_model, spans):
    engine = make_stepped_engine(spans=spans)
    llm = engine.engine
    await engine.sync_weights(tiny_model, 3)  # the loop's first push (a run resumed at step 3)
    stream = engine.generate_stream([1, 2], SamplingParams())
    chunks = [await next_chunk(stream, llm), await next_chunk(stream, llm)]
    llm.calls.clear()
    with torch.no_grad():
        tiny_model.model.layers[0].self_attn.q_proj.weight.add_(1.0)  # the optimizer step
    await engine.sync_weights(tiny_model, 4)  # between two steps, the request running
    assert llm.calls == [("pause_generation", "keep", False), "start_weight_update", "update_weights",
                         "finish_weight_update", ("reset_prefix_cache", True), "resume_generation"]
    chunks += [await next_chunk(stream, llm) for _ in range(4)]
    generation = await stream.__anext__()

    assert chunks == [[100], [101], [102], [103], [104], [105]]
    assert generation.token_ids == [100, 101, 102, 103, 104, 105] and generation.finish_reason == "length"
    [(request_id, label)] = llm.recomputed  # preempted, not aborted: its KV recomputed by the new weights
    assert label == "4"
    torch.testing.assert_close(llm.loaded["model.layers.0.self_attn.q_proj.weight"],
                               tiny_model.model.layers[0].self_attn.q_proj.weight.detach())
    sampled_by = [3, 3, 4, 4, 4, 4]
    if spans:  # vLLM's own labels: exact
        assert generation.versions == sampled_by
    else:  # the first chunk after the update is labelled one version older: conservative, never newer
        assert generation.versions == [3, 3, 3, 4, 4, 4]


async def test_a_slow_readers_merged_chunk_is_never_labelled_newer_than_its_tokens(stand_in_vllm, tiny_model):
    """Without vLLM's spans: tokens sampled before an update that reach the reader after it keep the old version."""
    engine = make_stepped_engine(spans=False)
    llm = engine.engine
    await engine.sync_weights(tiny_model, 0)
    stream = engine.generate_stream([1], SamplingParams())
    reading = asyncio.ensure_future(stream.__anext__())
    await settle()
    # Nothing below yields to the reader (the stand-in's calls finish at once): two steps, the update
    # and two more steps all pile up in the request's slot before the reader takes them.
    llm.step()
    llm.step()
    await engine.sync_weights(tiny_model, 1)
    llm.step()
    llm.step()
    assert await reading == [100, 101, 102, 103]
    rest = [await next_chunk(stream, llm), await next_chunk(stream, llm)]
    generation = await stream.__anext__()
    assert rest == [[104], [105]]
    sampled_by = [0, 0, 1, 1, 1, 1]
    assert generation.versions[:2] == [0, 0], "tokens sampled before the update were labelled with the new version"
    assert all(label <= truth for label, truth in zip(generation.versions, sampled_by, strict=True))
    assert generation.versions[-1] == 1


async def test_a_request_sent_during_an_update_waits_for_the_new_weights(stand_in_vllm, tiny_model):
    engine = make_stepped_engine()
    llm = engine.engine
    await engine.sync_weights(tiny_model, 0)
    engine._pending = (tiny_model, 1)  # an update under way: sync_weights set it and awaits the lock
    async with engine._lock:
        stream = engine.generate_stream([1], SamplingParams())
        reading = asyncio.ensure_future(stream.__anext__())
        await settle()
        assert "generate" not in llm.calls  # not sent to vLLM before the update is done
    for _ in range(20):
        llm.step()
        await settle()
        if reading.done():
            break
    assert await reading == [100] and llm.label == "1" and engine.policy_version == 1


# -- the training loop with vllm ------------------------------------------------------------------
def loop_setup(engine, model, calls, config, *, gate=None):
    """A Setup for one training step: a recording trainer (its step moves the weights), stand-in session/pipeline."""
    from agenttune.backbones.local.loop import Setup

    def step(episodes, threads=None):
        calls.append("trainer.step")
        if gate is not None:
            assert gate.wait(timeout=10), "the event loop did not go on during the update"
        with torch.no_grad():
            model.model.layers[0].self_attn.q_proj.weight.add_(1.0)
        return {"train/loss": 0.0}

    async def next_batch():
        return [], {}

    async def run_tasks(tasks):
        return []

    advanced = []
    pipeline = types.SimpleNamespace(next_batch=next_batch, advance=advanced.append, ahead=lambda: False)
    session = types.SimpleNamespace(config=config, record=lambda step, split, episodes: {},
                                    rollout=types.SimpleNamespace(run_tasks=run_tasks))
    setup = Setup(model=model, tokenizer=None, trainer=types.SimpleNamespace(step=step), order=types.SimpleNamespace(
        next_batch=lambda: [], epoch=0), validation=[], total_steps=2, start_step=0, components=None, engine=engine,
        pipeline=pipeline if config.trainer.staleness_bound is not None else None)
    return session, setup, advanced


PROGRESS = types.SimpleNamespace(phase=lambda text: None)


async def test_the_asynchronous_loop_updates_vllm_while_requests_run_and_never_sleeps(stand_in_vllm, tiny_model):
    from agenttune.backbones.local.loop import _check_engine, _train_step_async
    from agenttune.components.engines.vllm import VLLMOptions, _sleep_level
    from agenttune.registry.config_loading import load_config

    config = load_config(None, ["trainer.mode=one_step_off"])
    engine = make_stepped_engine(sleep_level=_sleep_level(config, VLLMOptions(), colocated=True), model=tiny_model)
    _check_engine(engine, config.trainer.staleness_bound)  # vllm takes asynchronous modes now
    llm = engine.engine
    gate = threading.Event()
    session, setup, advanced = loop_setup(engine, tiny_model, llm.calls, config, gate=gate)
    await engine.sync_weights(tiny_model, 0)  # training_loop's first push
    stream = engine.generate_stream([1], SamplingParams())
    chunks = [await next_chunk(stream, llm)]
    training = asyncio.ensure_future(_train_step_async(session, setup, PROGRESS, 1))
    while "trainer.step" not in llm.calls:
        await asyncio.sleep(0.01)
    chunks.append(await next_chunk(stream, llm))  # decoding goes on during the update
    gate.set()
    metrics = await training
    chunks += [await next_chunk(stream, llm) for _ in range(4)]
    generation = await stream.__anext__()

    calls = [call for call in llm.calls if call != "generate"]
    assert calls[calls.index("trainer.step"):] == [
        "trainer.step", ("pause_generation", "keep", False), "start_weight_update", "update_weights",
        "finish_weight_update", ("reset_prefix_cache", True), "resume_generation"]
    assert not [call for call in llm.calls if call[0] in ("sleep", "wake_up")]
    assert generation.versions == [0, 0, 1, 1, 1, 1] and advanced == [1] and metrics["train/loss"] == 0.0
    torch.testing.assert_close(llm.loaded["model.layers.0.self_attn.q_proj.weight"],
                               tiny_model.model.layers[0].self_attn.q_proj.weight.detach())


async def test_the_synchronous_loop_still_sleeps_through_the_update(stand_in_vllm, tiny_model):
    from agenttune.backbones.local.loop import _train_step
    from agenttune.components.engines.vllm import VLLMOptions, _sleep_level
    from agenttune.registry.config_loading import load_config

    config = load_config(None, [])
    engine = make_engine(sleep_level=_sleep_level(config, VLLMOptions(), colocated=True))
    session, setup, _ = loop_setup(engine, tiny_model, engine.engine.calls, config)
    await _train_step(session, setup, PROGRESS, 1)
    assert engine.engine.calls == [
        ("sleep", 2), "trainer.step", ("wake_up", ["weights"]), ("init_weight_transfer_engine", {"packed": False}),
        "start_weight_update", "update_weights", "finish_weight_update", ("wake_up", ["kv_cache"]),
        ("reset_prefix_cache", True)]
    assert engine.policy_version == 1 and engine.engine.label == "1"


def test_asynchronous_training_hands_vllm_the_trained_model_and_hf_a_copy(tiny_model):
    from agenttune.backbones.local.loop import rollout_model
    from agenttune.registry.config_loading import load_config
    from agenttune.registry.resolution import engine_class

    assert engine_class(load_config(None, ["engine.type=vllm"])).copies_weights
    assert not engine_class(load_config(None, ["engine.type=hf"])).copies_weights
    assert rollout_model(tiny_model, 1, engine_copies=True) is tiny_model  # vLLM holds its own copy
    copied = rollout_model(tiny_model, 1)
    assert copied is not tiny_model and not any(p.requires_grad for p in copied.parameters())
    assert rollout_model(tiny_model, None) is tiny_model


def test_vllm_weight_version_spans_become_per_token_versions():
    from agenttune.components.engines.vllm import span_versions

    def completion(spans, n):
        return Completion(list(range(n)), None, "stop", weight_versions=spans)

    assert span_versions(completion([Span("3", 0, 2), Span("4", 2, 5)], 5)) == [3, 3, 4, 4, 4]
    assert span_versions(completion(None, 2)) is None  # not the final output, or no labels
    assert span_versions(completion([Span("default", 0, 2)], 2)) is None  # vLLM's own label, not a version
    assert span_versions(completion([Span("1", 0, 2)], 3)) is None  # not covering every token
    assert span_versions(completion([Span("1", 1, 3)], 2)) is None


# -- scoring prompts (a distillation teacher, agenttune serve's /v1/completions echo) -------------------
@dataclass
class ScoredOutput:  # the RequestOutput fields prompt scoring reads
    prompt_logprobs: list
    outputs: list[Completion]


class ScoringAsyncLLM(StandInAsyncLLM):
    """vLLM's prompt log-probs in their list form: None first, then {actual token: Logprob}; here each
    token's log-prob is -token/1000, so a value tells which token (and position) it belongs to."""

    async def generate(self, prompt, params, request_id):
        self.calls.append("generate")
        self.requests.append((prompt, params, request_id))
        ids = prompt["prompt_token_ids"]
        yield ScoredOutput([None] + [{token: Logprob(-token / 1000)} for token in ids[1:]], [Completion([3], None, "length")])


async def test_prompt_logprobs_reads_each_tokens_entry_after_the_first(stand_in_vllm):
    from agenttune.components.engines.vllm import VLLMEngine

    engine = make_engine()
    engine.engine = ScoringAsyncLLM(FakeIPC())
    assert VLLMEngine.scores_prompts
    assert await engine.prompt_logprobs([5, 9, 2]) == [-0.009, -0.002]
    assert await engine.prompt_logprobs([5]) == []  # nothing to score: vLLM is not asked
    prompt, params, _ = engine.engine.requests[0]
    assert prompt == {"prompt_token_ids": [5, 9, 2]}
    assert params.kwargs == {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "detokenize": False}


async def test_prompt_logprobs_refuses_entries_that_do_not_cover_the_prompt(stand_in_vllm):
    from agenttune.components.engines.vllm import scored_prompt

    with pytest.raises(RuntimeError, match="prompt log-probs for 2 of the prompt's 3 tokens"):
        scored_prompt([None, {9: Logprob(-1.0)}], [5, 9, 2])
    with pytest.raises(RuntimeError, match="for 0 of"):
        scored_prompt(None, [5, 9])  # a request sent without prompt_logprobs


def test_a_vllm_teacher_sleeps_between_steps_and_scores_every_row_in_place(stand_in_vllm):
    """The teacher's cycle (sleep level 1): asleep from the start, woken by a step's scoring, asleep
    again after it; each row's scores land in its own columns (column t: input token t+1)."""
    from agenttune.backbones.local.logprobs import Batch
    from agenttune.backbones.local.teacher import EngineTeacher
    from agenttune.components.engines.vllm import VLLMEngine

    vllm = ScoringAsyncLLM(FakeIPC())
    teacher = EngineTeacher(VLLMEngine(vllm, sleep_level=1), failure="f", hint="h")
    assert vllm.calls == [("sleep", 1)]
    rows = [[11, 12, 13, 14], [21, 22, 0, 0]]  # the second row right-padded
    ids = torch.tensor(rows)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    batch = Batch(ids, mask, ids[:, 1:], mask[:, 1:].float(), torch.zeros(2, 3), torch.zeros(2))
    scores = teacher.score([batch, batch])
    expected = torch.tensor([[-0.012, -0.013, -0.014], [-0.022, 0.0, 0.0]])
    assert all(torch.allclose(score, expected) for score in scores)
    assert vllm.calls == [("sleep", 1), ("wake_up", None)] + ["generate"] * 4 + [("sleep", 1)]
    teacher.score([batch])
    assert vllm.calls[-3:] == ["generate", "generate", ("sleep", 1)] and ("wake_up", None) in vllm.calls[7:]
    teacher.close()
    assert not teacher._thread.is_alive()


# -- config ---------------------------------------------------------------------------------------
def test_engine_section_validation():
    from pydantic import ValidationError

    from agenttune.components.engines.vllm import VLLMOptions

    assert VLLMOptions().sleep_level == 2
    for bad in ({"sleep_level": 3}, {"gpu_memory_utilization": 0}, {"max_num_batched_tokens": 0},
                {"enable_sleep_mode": True}):
        with pytest.raises(ValidationError):
            VLLMOptions(**bad)


def test_vllm_arguments_colocated_and_alone(tiny_model_path):
    from agenttune.components.engines.vllm import VLLMOptions, engine_arguments
    from agenttune.config.models import AgentTuneConfig

    config = AgentTuneConfig.model_validate({"model": {"path": str(tiny_model_path)}})
    colocated = engine_arguments(config, VLLMOptions(max_num_batched_tokens=4096), colocated=True)
    assert colocated["logprobs_mode"] == "processed_logprobs"
    assert colocated["enable_sleep_mode"] is True and colocated["max_num_batched_tokens"] == 4096
    assert colocated["weight_transfer_config"] == {"backend": "ipc"}
    assert engine_arguments(config, VLLMOptions(sleep_level=0), colocated=True)["enable_sleep_mode"] is False
    for mode in ("async", "one_step_off"):  # rollouts go on during the update: vLLM never sleeps
        asynchronous = AgentTuneConfig.model_validate({"model": {"path": str(tiny_model_path)},
                                                       "trainer": {"mode": mode}})
        assert engine_arguments(asynchronous, VLLMOptions(), colocated=True)["enable_sleep_mode"] is False
    alone = engine_arguments(config, VLLMOptions(), colocated=False)  # agenttune serve: no trainer
    assert "enable_sleep_mode" not in alone and "weight_transfer_config" not in alone
    assert alone["logprobs_mode"] == "processed_logprobs" and "max_num_batched_tokens" not in alone


def test_colocating_needs_one_cuda_gpu(tiny_model):
    from agenttune.components.engines.vllm import VLLMOptions, _check_colocatable

    with pytest.raises(UserError, match="tensor_parallel_size is 2"):
        _check_colocatable(VLLMOptions(tensor_parallel_size=2), tiny_model)
    with pytest.raises(UserError, match="on 'cpu'") as error:
        _check_colocatable(VLLMOptions(), tiny_model)
    assert "engine.type: hf" in error.value.hint
