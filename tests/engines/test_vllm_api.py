"""The `vllm` engine against the installed vLLM package's real classes (`nox -s vllm`; skipped elsewhere).

vLLM's GPU kernels cannot run here, but its Python API imports on CPU. What this proves:
- every `AsyncLLM` method the engine calls (generate, sleep, wake_up, reset_prefix_cache, the weight
  transfer's init/start/update/finish, shutdown) exists, is awaitable where we await it, and accepts
  the exact arguments we pass: the engine's own code runs against a recorder that binds each call to
  the real method's `inspect.signature`;
- the weight update payload and init info are accepted by vLLM's own `IPCWeightTransferUpdateInfo`
  / `IPCWeightTransferInitInfo` (names, dtypes, shapes, pickled handles);
- our `AsyncEngineArgs` build the real dataclass, with a `logprobs_mode` and weight-transfer
  backend this vLLM knows;
- our SamplingParams (guides included) construct vLLM's real `SamplingParams`;
- vLLM's real `RequestOutput` / `CompletionOutput` / `Logprob` (list and `FlatLogprobs` forms)
  translate to Generations.
What is not tested here: CUDA (the IPC handles themselves, sleep mode's allocator, decoding).
"""

from __future__ import annotations

import inspect
import typing

import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm import AsyncEngineArgs, AsyncLLMEngine  # noqa: E402
from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest  # noqa: E402
from vllm.distributed.weight_transfer.ipc_engine import (  # noqa: E402
    IPCWeightTransferInitInfo,
    IPCWeightTransferUpdateInfo,
)
from vllm.logprobs import Logprob, append_logprobs_for_next_position, create_sample_logprobs  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402

from agenttune.engine import Generation, Guide, SamplingParams  # noqa: E402
from agenttune.engines.vllm import VLLMEngine, VLLMOptions, engine_arguments, to_generation  # noqa: E402

# What `generate` yields in the recorder: vLLM's real output classes.
SAMPLED = [(5, -0.5), (9, -0.25), (2, -2.0)]


def real_request_output(request_id: str, *, flat: bool, finished: bool = True) -> RequestOutput:
    logprobs = create_sample_logprobs(flat)
    for token, logprob in SAMPLED:
        # the sampled token first (rank 3), then the top-1 alternative
        append_logprobs_for_next_position(logprobs, [token, 7], [logprob, -0.1], [None, None], rank=3, num_logprobs=1)
    completion = CompletionOutput(index=0, text="", token_ids=[t for t, _ in SAMPLED], cumulative_logprob=None,
                                  logprobs=logprobs, finish_reason="stop" if finished else None)
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[1, 2], prompt_logprobs=None,
                         outputs=[completion], finished=finished)


class CheckedAsyncLLM:
    """Stands in for a running AsyncLLM; every call is bound to the real method's signature first."""

    def __init__(self, *, flat: bool = False):
        self.calls: list[str] = []
        self.flat = flat

    def _check(self, name: str, args: tuple, kwargs: dict, *, awaited: bool) -> None:
        method = getattr(AsyncLLMEngine, name, None)
        assert method is not None, f"vLLM's AsyncLLM has no {name}()"
        inspect.signature(method).bind(self, *args, **kwargs)  # TypeError if an argument is wrong
        if awaited:
            assert inspect.iscoroutinefunction(method), f"AsyncLLM.{name} is not a coroutine function"
        self.calls.append(name)

    def generate(self, *args, **kwargs):
        self._check("generate", args, kwargs, awaited=False)
        assert inspect.isasyncgenfunction(AsyncLLMEngine.generate)
        request_id = kwargs.get("request_id", args[2] if len(args) > 2 else "r")

        async def outputs():
            yield real_request_output(request_id, flat=self.flat, finished=False)
            yield real_request_output(request_id, flat=self.flat)

        return outputs()

    def shutdown(self, *args, **kwargs):
        self._check("shutdown", args, kwargs, awaited=False)

    def __getattr__(self, name: str):
        async def call(*args, **kwargs):
            self._check(name, args, kwargs, awaited=True)
            if name == "init_weight_transfer_engine":
                (request,) = args
                assert isinstance(request, WeightTransferInitRequest)
                IPCWeightTransferInitInfo(**request.init_info)
            if name == "update_weights":
                (request,) = args
                assert isinstance(request, WeightTransferUpdateRequest)
                self.update = IPCWeightTransferUpdateInfo(**request.update_info)
            return True  # wake_up / reset_prefix_cache report success

        return call


def fake_share(tensor):
    return "GPU-0", ("handle", tuple(tensor.shape))  # CUDA IPC needs a GPU; vLLM's dataclass only checks shape


@pytest.fixture
def insecure_serialization(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # set by VLLMEngine.from_config when colocated


async def test_the_colocated_cycle_calls_vllm_as_it_is_defined(tiny_model, insecure_serialization):
    engine = VLLMEngine(CheckedAsyncLLM(), sleep_level=2, model=tiny_model, share=fake_share)
    generation = await engine.generate([1, 2], SamplingParams(temperature=0.7, max_tokens=8, seed=3), request_id="a")
    await engine.release_memory()
    await engine.sync_weights(tiny_model)
    await engine.release_memory()
    streamed = [event async for event in engine.generate_stream([1, 2], SamplingParams())]  # wakes, no update
    await engine.aclose()

    calls = engine.engine.calls
    assert calls == ["init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update",
                     "reset_prefix_cache", "generate",
                     "sleep", "wake_up", "start_weight_update", "update_weights", "finish_weight_update", "wake_up",
                     "reset_prefix_cache",
                     "sleep", "wake_up", "generate", "shutdown"]
    update = engine.engine.update
    assert update.names == [name for name, _ in tiny_model.named_parameters()]
    assert update.dtype_names == ["float32"] * len(update.names)
    assert update.ipc_handles[0] == {"GPU-0": ("handle", tuple(update.shapes[0]))}
    assert generation.token_ids == [5, 9, 2] and generation.logprobs == [-0.5, -0.25, -2.0]
    assert streamed[-1].token_ids == [5, 9, 2]


async def test_the_update_payload_pickles_what_vllms_worker_unpickles(insecure_serialization):
    from agenttune.engines.vllm import ipc_update_info

    tensors = [torch.zeros(2, 3, dtype=torch.bfloat16), torch.ones(4)]
    info = IPCWeightTransferUpdateInfo(**ipc_update_info(["a.weight", "b.bias"], tensors, fake_share))
    assert info.dtype_names == ["bfloat16", "float32"] and info.shapes == [[2, 3], [4]]
    assert info.ipc_handles == [{"GPU-0": ("handle", (2, 3))}, {"GPU-0": ("handle", (4,))}]
    assert getattr(torch, info.dtype_names[0]) is torch.bfloat16  # how vLLM's worker turns the name back


def test_engine_arguments_build_vllms_async_engine_args(tiny_model_path):
    from vllm.config.model import LogprobsMode
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from agenttune.config import AgentTuneConfig

    config = AgentTuneConfig.model_validate({"model": {"path": str(tiny_model_path)}})
    for colocated in (True, False):
        arguments = engine_arguments(config, VLLMOptions(max_num_batched_tokens=4096), colocated=colocated)
        built = AsyncEngineArgs(**arguments)  # TypeError on a field this vLLM does not have
        for name, value in arguments.items():
            if name != "weight_transfer_config":
                assert getattr(built, name) == value, name
    assert isinstance(built, AsyncEngineArgs)
    assert arguments["logprobs_mode"] in typing.get_args(LogprobsMode)
    colocated = AsyncEngineArgs(**engine_arguments(config, VLLMOptions(), colocated=True))
    assert isinstance(colocated.weight_transfer_config, WeightTransferConfig)
    assert colocated.weight_transfer_config.backend == "ipc" and colocated.enable_sleep_mode is True
    registered = getattr(WeightTransferEngineFactory, "_registry", None)
    if registered is not None:  # the factory's registry of backend names, where this vLLM keeps one
        assert "ipc" in registered


def test_sampling_params_build_vllms_sampling_params():
    from vllm.sampling_params import StructuredOutputsParams

    from agenttune.engines.vllm import vllm_sampling

    params = vllm_sampling(SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_tokens=16, stop=("</x>",),
                                          stop_token_ids=(2,), seed=4))
    assert isinstance(params, vllm.SamplingParams)
    assert (params.temperature, params.top_p, params.max_tokens, params.seed, params.logprobs) == (0.7, 0.9, 16, 4, 0)
    assert params.stop == ["</x>"] and params.stop_token_ids == [2]
    assert params.top_k in (-1, 0)  # "no top-k" in this vLLM's spelling
    schema = '{"type": "object"}'
    guided = vllm_sampling(SamplingParams(guide=Guide("json_schema", schema)))
    assert isinstance(guided.structured_outputs, StructuredOutputsParams) and guided.structured_outputs.json == schema
    tagged = vllm_sampling(SamplingParams(guide=Guide("structural_tag", '{"type": "structural_tag"}')))
    assert tagged.structured_outputs.structural_tag == '{"type": "structural_tag"}'


@pytest.mark.parametrize("flat", [False, True], ids=["list", "FlatLogprobs"])
def test_real_vllm_outputs_become_generations(flat):
    output = real_request_output("r", flat=flat)
    generation = to_generation(output.outputs[0])
    assert generation == Generation([5, 9, 2], [-0.5, -0.25, -2.0], "stop")
    assert isinstance(output.outputs[0].logprobs[0][5], Logprob)
    aborted = CompletionOutput(index=0, text="", token_ids=[4], cumulative_logprob=None, logprobs=None,
                               finish_reason="abort")
    assert to_generation(aborted) == Generation([4], None, "abort")


def test_from_engine_args_is_called_as_vllm_defines_it(tiny_model_path):
    """`from_config` calls it without await, with the built AsyncEngineArgs."""
    method = AsyncLLMEngine.from_engine_args
    assert not inspect.iscoroutinefunction(method)
    inspect.signature(method).bind(AsyncEngineArgs(model=str(tiny_model_path)))
