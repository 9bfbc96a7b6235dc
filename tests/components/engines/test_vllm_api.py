"""The `vllm` engine against the installed vLLM package's real classes (`nox -s vllm`; skipped elsewhere).

vLLM's GPU kernels cannot run here, but its Python API imports on CPU. What this proves:
- every `AsyncLLM` method the engine calls (generate, sleep, wake_up, reset_prefix_cache, the weight
  transfer's init/start/update/finish, pause_generation/resume_generation, shutdown) exists, is
  awaitable where we await it, and accepts the exact arguments we pass: the engine's own code runs
  against a recorder that binds each call to the real method's `inspect.signature`;
- asynchronous training's update among requests in flight: `keep` is a pause mode of this vLLM, its
  scheduler's reset with `reset_running_requests` preempts running requests (it does not abort
  them), and its real output processor labels tokens with the weight version we set, in spans that
  survive a slow reader's merged outputs and become our per-token versions;
- the weight update payload and init info are accepted by vLLM's own `IPCWeightTransferUpdateInfo`
  / `IPCWeightTransferInitInfo` (names, dtypes, shapes, pickled handles);
- our `AsyncEngineArgs` build the real dataclass, with a `logprobs_mode` and weight-transfer
  backend this vLLM knows;
- our SamplingParams (guides included) construct vLLM's real `SamplingParams`;
- vLLM's real `RequestOutput` / `CompletionOutput` / `Logprob` (list and `FlatLogprobs` forms)
  translate to Generations.
- prompt scoring (`prompt_logprobs`: a `teacher_engine: vllm` distillation teacher, `agenttune serve`'s
  echo): our scoring SamplingParams build vLLM's real class; prompt log-probs computed by vLLM's own
  Sampler rule from a tiny model's logits, whole or in prefill chunks, go through vLLM's real
  OutputProcessor into `RequestOutput.prompt_logprobs` (list and `FlatLogprobs` forms) and come out
  as each token's log-prob; the teacher built on it (sleeping between steps) gives the `hf`
  teacher's values.
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

from agenttune.components.engines.base import Generation, Guide, SamplingParams  # noqa: E402
from agenttune.components.engines.vllm import VLLMEngine, VLLMOptions, engine_arguments, to_generation  # noqa: E402

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
        self.arguments: dict[str, inspect.BoundArguments] = {}  # the last call of each method, bound
        self.flat = flat

    def _check(self, name: str, args: tuple, kwargs: dict, *, awaited: bool) -> None:
        method = getattr(AsyncLLMEngine, name, None)
        assert method is not None, f"vLLM's AsyncLLM has no {name}()"
        self.arguments[name] = inspect.signature(method).bind(self, *args, **kwargs)  # TypeError if one is wrong
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
    assert calls == ["pause_generation", "init_weight_transfer_engine", "start_weight_update", "update_weights",
                     "finish_weight_update", "reset_prefix_cache", "resume_generation", "generate",
                     "sleep", "wake_up", "start_weight_update", "update_weights", "finish_weight_update", "wake_up",
                     "reset_prefix_cache",
                     "sleep", "wake_up", "generate", "shutdown"]
    update = engine.engine.update
    assert update.names == [name for name, _ in tiny_model.named_parameters()]
    assert update.dtype_names == ["float32"] * len(update.names)
    assert update.ipc_handles[0] == {"GPU-0": ("handle", tuple(update.shapes[0]))}
    assert generation.token_ids == [5, 9, 2] and generation.logprobs == [-0.5, -0.25, -2.0]
    assert streamed[-1].token_ids == [5, 9, 2]


async def test_the_asynchronous_update_calls_vllm_as_it_is_defined(tiny_model, insecure_serialization):
    """Asynchronous modes: vLLM awake (sleep level 0), the update lands among requests in flight."""
    from vllm.v1.engine import PauseMode

    engine = VLLMEngine(CheckedAsyncLLM(), sleep_level=0, model=tiny_model, share=fake_share)
    await engine.sync_weights(tiny_model, 7)
    generation = await engine.generate([1, 2], SamplingParams())
    calls = engine.engine.calls
    assert calls == ["pause_generation", "init_weight_transfer_engine", "start_weight_update", "update_weights",
                     "finish_weight_update", "reset_prefix_cache", "resume_generation", "generate"]
    bound = engine.engine.arguments
    assert bound["pause_generation"].arguments["mode"] == "keep" and "keep" in typing.get_args(PauseMode)
    assert bound["pause_generation"].arguments["clear_cache"] is False
    assert bound["finish_weight_update"].arguments["weight_version"] == "7"
    assert bound["reset_prefix_cache"].arguments["reset_running_requests"] is True
    assert generation.token_ids == [5, 9, 2]


def test_resetting_running_requests_preempts_them_rather_than_aborting():
    """What vLLM 0.33's scheduler does with `reset_running_requests=True` (its source; the scheduler
    needs a GPU config to build): running requests go back to the waiting queue (recomputed on resume)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    source = inspect.getsource(Scheduler.reset_prefix_cache)
    assert "self._preempt_request(" in source and "finish_requests" not in source
    preempt = inspect.getsource(Scheduler._preempt_request)
    assert "self.waiting.prepend_request(request)" in preempt and "num_computed_tokens = 0" in preempt


async def test_vllms_output_processor_labels_tokens_with_our_weight_versions():
    """vLLM's real OutputProcessor and per-request collector: the engine core's step outputs carry
    the weight version set last; a reader that only looks at the end gets the outputs merged, with
    exact per-token labels that become the Generation's versions."""
    import time

    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

    processor = OutputProcessor(None, log_stats=False)
    params = vllm.SamplingParams(max_tokens=4, output_kind=RequestOutputKind.CUMULATIVE, detokenize=False)
    request = EngineCoreRequest(request_id="r", prompt_token_ids=[1, 2], mm_features=None, sampling_params=params,
                                pooling_params=None, arrival_time=time.time(), lora_request=None, cache_salt=None,
                                data_parallel_rank=None)
    request.external_req_id = "r"  # AsyncLLM sets it when it takes a request
    collector = RequestOutputCollector(RequestOutputKind.CUMULATIVE, "r")
    processor.add_request(request, None, None, 0, collector)
    for token, label in ((5, "3"), (6, "3"), (7, "4")):  # an update to version 4 between two steps
        processor.process_outputs([EngineCoreOutput("r", [token])], weight_version=label)
    processor.process_outputs([EngineCoreOutput("r", [8], finish_reason=FinishReason.LENGTH)], weight_version="4")
    output = await collector.get()
    assert output.finished
    assert to_generation(output.outputs[0]).versions == [3, 3, 4, 4]


async def test_the_update_payload_pickles_what_vllms_worker_unpickles(insecure_serialization):
    from agenttune.components.engines.vllm import ipc_update_info

    tensors = [torch.zeros(2, 3, dtype=torch.bfloat16), torch.ones(4)]
    info = IPCWeightTransferUpdateInfo(**ipc_update_info(["a.weight", "b.bias"], tensors, fake_share))
    assert info.dtype_names == ["bfloat16", "float32"] and info.shapes == [[2, 3], [4]]
    assert info.ipc_handles == [{"GPU-0": ("handle", (2, 3))}, {"GPU-0": ("handle", (4,))}]
    assert getattr(torch, info.dtype_names[0]) is torch.bfloat16  # how vLLM's worker turns the name back


def test_engine_arguments_build_vllms_async_engine_args(tiny_model_path):
    from vllm.config.model import LogprobsMode
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from agenttune.config.models import AgentTuneConfig

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

    from agenttune.components.engines.vllm import vllm_sampling

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


def test_real_weight_version_spans_become_per_token_versions():
    from vllm.outputs import WeightVersionSpan

    spans = [WeightVersionSpan("1", 0, 2), WeightVersionSpan("2", 2, 3)]
    completion = CompletionOutput(index=0, text="", token_ids=[5, 9, 2], cumulative_logprob=None, logprobs=None,
                                  finish_reason="stop", weight_versions=spans)
    assert to_generation(completion).versions == [1, 1, 2]


def test_from_engine_args_is_called_as_vllm_defines_it(tiny_model_path):
    """`from_config` calls it without await, with the built AsyncEngineArgs."""
    method = AsyncLLMEngine.from_engine_args
    assert not inspect.iscoroutinefunction(method)
    inspect.signature(method).bind(AsyncEngineArgs(model=str(tiny_model_path)))


# -- scoring prompts: vLLM's prompt log-probs (a distillation teacher, agenttune serve's echo) -------
def test_scoring_params_are_vllms_prompt_logprobs_request():
    from agenttune.components.engines.vllm import scoring_params

    params = scoring_params()
    assert isinstance(params, vllm.SamplingParams)
    assert (params.prompt_logprobs, params.max_tokens, params.logprobs, params.detokenize) == (0, 1, None, False)
    assert params.skip_reading_prefix_cache  # vLLM's own rule: cached blocks would skip prompt log-probs


def scored_request_output(model, token_ids: list[int], params, *, chunks: int = 1) -> RequestOutput:
    """What vLLM 0.33 hands AsyncLLM's caller for a prompt scored with `params`: its engine core's prompt
    log-probs (the model runner's rule: log_softmax of each position's logits, gathered at the next
    prompt token by vLLM's own Sampler, in `chunks` prefill chunks) through its real OutputProcessor."""
    import time

    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
    from vllm.v1.sample.sampler import Sampler

    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0, :-1]
    scores = Sampler.compute_logprobs(logits)
    tensors = Sampler.gather_logprobs(scores, params.prompt_logprobs, torch.tensor(token_ids[1:]))
    processor = OutputProcessor(None, log_stats=False)
    request = EngineCoreRequest(request_id="s", prompt_token_ids=list(token_ids), mm_features=None,
                                sampling_params=params, pooling_params=None, arrival_time=time.time(),
                                lora_request=None, cache_salt=None, data_parallel_rank=None)
    request.external_req_id = "s"
    collector = RequestOutputCollector(RequestOutputKind.CUMULATIVE, "s")
    processor.add_request(request, None, None, 0, collector)
    bounds = [round(i * (len(token_ids) - 1) / chunks) for i in range(chunks + 1)]
    for start, end in zip(bounds, bounds[1:], strict=False):  # chunked prefill: several engine-core outputs
        chunk = type(tensors)(*(part[start:end] for part in tensors[:3]))
        processor.process_outputs([EngineCoreOutput("s", [], new_prompt_logprobs_tensors=chunk)])
    processor.process_outputs([EngineCoreOutput("s", [7], finish_reason=FinishReason.LENGTH)])
    output = collector.get_nowait()
    assert output is not None and output.finished
    return output


@pytest.mark.parametrize("chunks", [1, 3])
def test_vllms_prompt_logprobs_become_each_tokens_score(tiny_model, chunks):
    from agenttune.components.engines.vllm import scored_prompt, scoring_params

    ids = [3, 17, 42, 8, 99, 5]
    output = scored_request_output(tiny_model, ids, scoring_params(), chunks=chunks)
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(ids)
    assert set(output.prompt_logprobs[1]) == {17} and isinstance(output.prompt_logprobs[1][17], Logprob)
    with torch.no_grad():
        expected = torch.log_softmax(tiny_model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    by_hand = [float(expected[i, token]) for i, token in enumerate(ids[1:])]
    assert scored_prompt(output.prompt_logprobs, ids) == pytest.approx(by_hand, abs=1e-5)


def test_flat_prompt_logprobs_read_as_the_list_form(tiny_model):
    """vLLM's FlatLogprobs (`flat_logprobs=True`): its first position is empty ({}), not None."""
    from agenttune.components.engines.vllm import scored_prompt

    ids = [3, 17, 42, 8]
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                                 flat_logprobs=True)
    flat = scored_request_output(tiny_model, ids, params)
    listed = scored_request_output(tiny_model, ids, vllm.SamplingParams(max_tokens=1, temperature=0.0,
                                                                        prompt_logprobs=0, detokenize=False))
    assert type(flat.prompt_logprobs).__name__ == "FlatLogprobs"
    assert scored_prompt(flat.prompt_logprobs, ids) == scored_prompt(listed.prompt_logprobs, ids)


class ScoringAsyncLLM(CheckedAsyncLLM):
    """`generate` checked against AsyncLLM's signature, answering with vLLM's real outputs for the
    prompt and the SamplingParams it was sent, scored by `model`."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def generate(self, *args, **kwargs):
        self._check("generate", args, kwargs, awaited=False)
        bound = self.arguments["generate"].arguments
        output = scored_request_output(self.model, bound["prompt"]["prompt_token_ids"], bound["sampling_params"])

        async def outputs():
            yield output

        return outputs()


def test_a_vllm_teacher_scores_as_the_hf_teacher_at_temperature_one(tiny_model):
    """The whole `teacher_engine: vllm` path on vLLM's real calls and outputs (sleep level 1 between
    steps): the same per-token log-probs as the `hf` teacher reading the same model."""
    from agenttune.backbones.local.batching import build_items
    from agenttune.backbones.local.logprobs import collate
    from agenttune.backbones.local.teacher import EngineTeacher, LocalTeacher
    from agenttune.workflow.episode import Episode, Sample
    from agenttune.workflow.task import Task

    episodes = [Episode(episode_id=f"e{n}", task=Task(task_id="t"), group_id="g", reward=0.0,
                        samples=[Sample(prompt_ids=list(range(10, 13 + n)), response_ids=list(range(40, 44 + 2 * n)),
                                        loss_mask=[1] * (4 + 2 * n), logprobs=[-1.0] * (4 + 2 * n))])
                for n in range(3)]
    items, _ = build_items(episodes, {e.episode_id: 0.0 for e in episodes}, max_prompt_length=64,
                           max_response_length=64)
    batches = [collate(items[:2], 0, "cpu"), collate(items[2:], 0, "cpu")]
    recorder = ScoringAsyncLLM(tiny_model)
    teacher = EngineTeacher(VLLMEngine(recorder, sleep_level=1), failure="f", hint="h")
    try:
        scores = teacher.score(batches)
    finally:
        teacher.close()
    expected = LocalTeacher(tiny_model.eval(), temperature=1.0).score(batches)
    for score, hf, batch in zip(scores, expected, batches, strict=True):
        assert torch.allclose(score * batch.mask, hf * batch.mask, atol=1e-5)
    assert recorder.calls == ["sleep", "wake_up"] + ["generate"] * 3 + ["sleep", "shutdown"]
    assert recorder.arguments["sleep"].arguments["level"] == 1


def test_the_teachers_engine_is_built_with_vllms_own_arguments(tiny_model_path, monkeypatch):
    """`VLLMEngine.scorer`: vLLM's real AsyncEngineArgs for the teacher (its model, the run's context plus
    the one token vLLM generates, sleep mode for level 1), handed to `from_engine_args` as vLLM defines it."""
    from agenttune.config.models import AgentTuneConfig

    built = []

    def from_engine_args(*args, **kwargs):
        inspect.signature(AsyncLLMEngine.from_engine_args).bind(*args, **kwargs)
        built.append(args[0])
        return CheckedAsyncLLM()

    monkeypatch.setattr(AsyncLLMEngine, "from_engine_args", from_engine_args)
    config = AgentTuneConfig.model_validate({"model": {"path": "tiny://distil-student", "max_model_len": 2048}})
    engine = VLLMEngine.scorer(config, VLLMOptions(sleep_level=1, gpu_memory_utilization=0.3), str(tiny_model_path))
    (arguments,) = built
    assert isinstance(arguments, AsyncEngineArgs)
    assert arguments.model == arguments.tokenizer == str(tiny_model_path)
    assert (arguments.max_model_len, arguments.enable_sleep_mode, arguments.gpu_memory_utilization) == (2049, True, 0.3)
    assert arguments.weight_transfer_config is None  # a teacher is never sent weights
    assert engine.sleep_level == 1 and VLLMEngine.scores_prompts
    VLLMEngine.scorer(config, VLLMOptions(sleep_level=0), str(tiny_model_path))
    assert built[-1].enable_sleep_mode is False
