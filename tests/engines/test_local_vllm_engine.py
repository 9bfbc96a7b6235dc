"""The `vllm` engine's translation of requests and outputs, against a stand-in for vLLM (no GPU here).

What is tested: sampling parameters map onto vLLM's, vLLM's outputs become Generations (ids,
per-token logprobs of the sampled tokens, finish reasons), weights are loaded into vLLM's model under
Hugging Face names (LoRA merged), and an unreachable model is an error, never stale weights.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest

from agenttune.engine import SamplingParams

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
class StandInModel:
    loaded: dict = field(default_factory=dict)

    def load_weights(self, weights):
        self.loaded = {name: tensor.clone() for name, tensor in weights}


class StandInEngine:
    def __init__(self, completion):
        self.completion = completion
        self.requests = []
        self.engine_core = types.SimpleNamespace(engine_core=types.SimpleNamespace(model_executor=types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
                model=StandInModel()))))))

    async def generate(self, prompt, params, request_id):
        self.requests.append((prompt, params, request_id))
        yield Output([Completion(self.completion.token_ids[:1], None, None)])  # streaming partial
        yield Output([self.completion])


@pytest.fixture
def vllm_engine(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=StandInSamplingParams))
    from agenttune.engines.vllm import VLLMEngine

    def make(completion):
        return VLLMEngine(StandInEngine(completion))

    return make


async def test_generate_returns_the_sampled_ids_and_their_logprobs(vllm_engine):
    completion = Completion([5, 9, 2], [{5: Logprob(-0.5), 7: Logprob(-1.0)}, {9: Logprob(-0.25)}, {2: Logprob(-2.0)}],
                            "stop")
    engine = vllm_engine(completion)
    generation = await engine.generate([1, 2, 3], SamplingParams(temperature=0.7, top_k=-1, max_tokens=16,
                                                                   stop=("</x>",), seed=4), request_id="r1")
    assert generation.token_ids == [5, 9, 2]
    assert generation.logprobs == [-0.5, -0.25, -2.0]
    assert generation.finish_reason == "stop"
    prompt, params, request_id = engine.engine.requests[0]
    assert prompt == {"prompt_token_ids": [1, 2, 3]} and request_id == "r1"
    assert params.kwargs == {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_tokens": 16, "stop": ["</x>"],
                             "stop_token_ids": None, "seed": 4, "logprobs": 0}


async def test_aborted_requests_and_missing_logprobs(vllm_engine):
    engine = vllm_engine(Completion([4], None, "abort"))
    generation = await engine.generate([1], SamplingParams())
    assert generation.finish_reason == "abort" and generation.logprobs is None


def test_weights_are_loaded_under_hugging_face_names_with_lora_merged(vllm_engine, tiny_model):
    peft = pytest.importorskip("peft")
    engine = vllm_engine(Completion([], [], "stop"))
    hugging_face_names = set(tiny_model.state_dict())
    policy = peft.get_peft_model(tiny_model, peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    engine.load_weights(policy)
    loaded = engine.engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model.loaded
    assert set(loaded) == hugging_face_names
    name = next(name for name in loaded if name.endswith("q_proj.weight"))
    with torch.no_grad():
        policy.merge_adapter()
        merged = policy.get_base_model().state_dict()[name.replace("q_proj.weight", "q_proj.base_layer.weight")].clone()
        policy.unmerge_adapter()
    torch.testing.assert_close(loaded[name], merged)
    assert not torch.equal(loaded[name], policy.get_base_model().state_dict()[
        name.replace("q_proj.weight", "q_proj.base_layer.weight")]), "the adapter was not merged in"


def test_an_unreachable_vllm_model_is_an_error_not_stale_weights(vllm_engine, tiny_model):
    from agenttune.engines.vllm import VLLMEngine

    engine = VLLMEngine(types.SimpleNamespace())
    with pytest.raises(RuntimeError, match="stale weights"):
        engine.load_weights(tiny_model)
