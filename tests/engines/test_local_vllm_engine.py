"""The `vllm` engine around vLLM itself (no GPU here, and vLLM is not installed in the core tests).

What is tested: sampling parameters map onto vLLM's; vLLM's outputs become Generations (ids, the
sampled tokens' logprobs, finish reasons); the trainer's weights get vLLM's names (peft's wrapping
stripped, LoRA merged, the model left unmerged after); the colocated cycle (sleep before the update;
after it wake the weights, transfer, wake the KV cache, reset the prefix cache) runs in that order,
delivers the trainer's exact weights, and also runs before the first generation; config errors.

What stands in for vLLM: `AsyncLLM` (a recorder that "loads" weights by decoding the update payload)
and the CUDA IPC handle (a registry key instead of a GPU memory handle). The `vllm` nox session
checks the same calls against the real package (tests/test_vllm_api.py).
"""

from __future__ import annotations

import base64
import pickle
import sys
import types
from dataclasses import dataclass, field

import pytest

from agenttune.engine import SamplingParams
from agenttune.engines.vllm_weights import vllm_weight_name, vllm_weights
from agenttune.errors import UserError

torch = pytest.importorskip("torch")


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None


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

    async def finish_weight_update(self):
        self.calls.append("finish_weight_update")


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
    from agenttune.engines.vllm import VLLMEngine

    ipc = FakeIPC()
    return VLLMEngine(StandInAsyncLLM(ipc, completion), sleep_level=sleep_level, model=model, share=ipc.share)


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
    from agenttune.engine import Guide

    engine = make_engine(Completion([5], [{5: Logprob(-0.5)}], "stop"))
    await engine.generate([1], SamplingParams(guide=Guide("structural_tag", '{"type": "structural_tag"}')))
    params = engine.engine.requests[0][1]
    assert params.kwargs["structured_outputs"].kwargs == {"structural_tag": '{"type": "structural_tag"}'}


async def test_vllm_streams_new_token_ids_then_the_generation(stand_in_vllm):
    from agenttune.engine import Generation

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
    await engine.sync_weights(tiny_model)
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
    assert engine.weight_version == 1

    engine.engine.calls.clear()
    await engine.release_memory()
    await engine.sync_weights(tiny_model)  # the transfer engine is set up once
    assert ("init_weight_transfer_engine", {"packed": False}) not in engine.engine.calls
    assert engine.weight_version == 2


async def test_without_sleep_mode_the_weights_still_load_and_the_cache_resets(stand_in_vllm, tiny_model):
    engine = make_engine(sleep_level=0)
    await engine.release_memory()
    await engine.sync_weights(tiny_model)
    assert [call for call in engine.engine.calls if call[0] in ("sleep", "wake_up")] == []
    assert engine.engine.calls[-1] == ("reset_prefix_cache", True) and engine.engine.loaded


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
    engine = make_engine()
    engine.engine.reset_succeeds = False
    with pytest.raises(RuntimeError, match="prefix cache"):
        await engine.sync_weights(tiny_model)


# -- config ---------------------------------------------------------------------------------------
def test_engine_section_validation():
    from pydantic import ValidationError

    from agenttune.engines.vllm import VLLMOptions

    assert VLLMOptions().sleep_level == 2
    for bad in ({"sleep_level": 3}, {"gpu_memory_utilization": 0}, {"max_num_batched_tokens": 0},
                {"enable_sleep_mode": True}):
        with pytest.raises(ValidationError):
            VLLMOptions(**bad)


def test_vllm_arguments_colocated_and_alone(tiny_model_path):
    from agenttune.config import AgentTuneConfig
    from agenttune.engines.vllm import VLLMOptions, engine_arguments

    config = AgentTuneConfig.model_validate({"model": {"path": str(tiny_model_path)}})
    colocated = engine_arguments(config, VLLMOptions(max_num_batched_tokens=4096), colocated=True)
    assert colocated["logprobs_mode"] == "processed_logprobs"
    assert colocated["enable_sleep_mode"] is True and colocated["max_num_batched_tokens"] == 4096
    assert colocated["weight_transfer_config"] == {"backend": "ipc"}
    assert engine_arguments(config, VLLMOptions(sleep_level=0), colocated=True)["enable_sleep_mode"] is False
    alone = engine_arguments(config, VLLMOptions(), colocated=False)  # agenttune serve: no trainer
    assert "enable_sleep_mode" not in alone and "weight_transfer_config" not in alone
    assert alone["logprobs_mode"] == "processed_logprobs" and "max_num_batched_tokens" not in alone


def test_colocating_needs_one_cuda_gpu(tiny_model):
    from agenttune.engines.vllm import VLLMOptions, _check_colocatable

    with pytest.raises(UserError, match="tensor_parallel_size is 2"):
        _check_colocatable(VLLMOptions(tensor_parallel_size=2), tiny_model)
    with pytest.raises(UserError, match="on 'cpu'") as error:
        _check_colocatable(VLLMOptions(), tiny_model)
    assert "engine.type: hf" in error.value.hint
