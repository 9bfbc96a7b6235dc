"""`vllm`: generation by an in-process vLLM engine, for GPU machines (`pip install 'agenttune[vllm]'`).

    engine:
      type: vllm
      gpu_memory_utilization: 0.4   # vLLM's share of the GPU; the trainer uses the rest
      sleep_level: 2                # free vLLM's memory while the trainer updates (0: never)

Prompt token ids go in, generated ids and their logprobs come out exactly as vLLM sampled them:
vLLM runs with `logprobs_mode="processed_logprobs"`, so a sampled token's logprob is taken after
temperature scaling (and grammar masks), which is what the trainer recomputes at the same
temperature. (vLLM's default, `raw_logprobs`, is the untempered distribution.) With top-k/top-p
set, vLLM's processed logprobs are of the truncated, renormalised distribution it sampled from.

`prompt_logprobs` scores given token ids with vLLM's own prompt log-probs (`SamplingParams(
prompt_logprobs=0)`: each prompt token's log-prob under the model at temperature 1; prompt tokens
skip the sampler's processors in every `logprobs_mode`): what an on-policy distillation teacher
(`teacher_engine: vllm`, `VLLMEngine.scorer`) and `agenttune serve --engine vllm`'s /v1/completions
with `echo` or `prompt_logprobs` need.

Colocated with the local backbone (as TRL's `vllm_mode="colocate"`): vLLM's engine core runs in
a child process on the trainer's GPU. Synchronous training (`trainer.mode: sync`), each step:

    await engine.release_memory()    # before the update: vLLM sleeps (level 2: weights and KV cache freed)
    ...trainer.step(...)...
    await engine.sync_weights(model, version) # after: wake the weights, load the new ones, wake the KV cache,
                                     # reset the prefix cache (its blocks were computed by the old weights)

Asynchronous training (`one_step_off`, `async`): rollouts go on while the trainer updates, so vLLM
never sleeps (its memory stays taken) and `sync_weights` lands the update among requests in flight:

    pause_generation(mode="keep", clear_cache=False)   # no step runs; requests stay queued, KV kept
    start_weight_update / update_weights / finish_weight_update(weight_version="<version>")
    reset_prefix_cache(reset_running_requests=True)     # running requests are preempted, not aborted:
    resume_generation()                                 # their KV is recomputed by the new weights

vLLM labels every scheduler step's output with the weight version set last, and the final output
carries the labels as spans over the generated tokens (`CompletionOutput.weight_versions`): these
become `Generation.versions`, exact per token (see `generate_stream` for the fallback).

The weights travel by CUDA IPC through vLLM's own weight-transfer engine (`weight_transfer_config:
{backend: ipc}`): the trainer shares each parameter's memory, vLLM's worker copies it into its
model with `load_weights`; nothing is written to disk. LoRA goes merged (see `vllm_weights`). The
trainer's weights are also pushed before the first generation, so a resumed or warmed-up policy
is what vLLM samples from. `train/logprob_mismatch` shows at once if the two ever disagree.

Status: written against vLLM 0.33's `AsyncLLM` API; agenttune's CI has no GPU. The `vllm` nox
session checks every call below against the installed package's real signatures and runs the
output translation on vLLM's real output classes; the GPU path itself is untested here.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import os
import pickle
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttune.components.engines.base import FinishReason, Generation, InferenceEngine, SamplingParams
from agenttune.components.engines.vllm_weights import vllm_weights
from agenttune.errors import UserError

# vLLM's logprobs of the sampled tokens after temperature, as the trainer recomputes them.
LOGPROBS_MODE = "processed_logprobs"
WEIGHT_TRANSFER_BACKEND = "ipc"


class VLLMOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(default=0.4, gt=0, le=1, description=(
        "Fraction of the GPU's memory vLLM may take (weights + KV cache); the trainer needs the rest."))
    tensor_parallel_size: int = Field(default=1, gt=0, description="GPUs per model (the local backbone: 1).")
    enforce_eager: bool = Field(default=True, description="Skip CUDA graphs: slower decoding, faster start and weight loads.")
    max_num_seqs: int = Field(default=256, gt=0, description="Most sequences decoded together.")
    max_num_batched_tokens: int | None = Field(default=None, gt=0, description=(
        "Most tokens in one vLLM scheduler step (vLLM's default when unset). TRL sets 4096 when colocated: "
        "a large value makes vLLM's memory profiler reserve more than a shared GPU has."))
    enable_prefix_caching: bool = Field(default=True, description=(
        "Reuse KV blocks of shared prompt prefixes (multi-turn episodes); reset after every weight update."))
    sleep_level: Literal[0, 1, 2] = Field(default=2, description=(
        "With the local backbone, what vLLM frees while the trainer updates: 2 = weights and KV cache (the "
        "new weights are loaded after the step anyway), 1 = KV cache freed and weights offloaded to CPU "
        "memory, 0 = nothing (vLLM's memory stays taken; no sleep mode). Asynchronous training modes never "
        "sleep (rollouts go on during the update), whatever this says."))


class VLLMEngine(InferenceEngine):
    enforces_guides: ClassVar[bool] = True
    scores_prompts: ClassVar[bool] = True  # vLLM's prompt_logprobs
    updates_weights: ClassVar[bool] = True  # pause (keep requests), load, preempt running requests, resume
    copies_weights: ClassVar[bool] = True  # vLLM's own copy, in its process: the trained model is only read
    name: ClassVar[str] = "vllm"
    Options: ClassVar[type[BaseModel]] = VLLMOptions

    def __init__(self, engine: Any, *, sleep_level: int = 0, model: Any = None,
                 share: Callable[[Any], tuple[str, tuple]] | None = None):
        self.engine = engine
        self.share = share or _cuda_ipc_handle  # tensor -> (GPU UUID, CUDA IPC handle)
        self.sleep_level = sleep_level
        self.policy_version = 0  # of the weights vLLM samples from (what `sync_weights` was given)
        # (model, version) whose weights vLLM must load before it generates again
        self._pending: tuple[Any, int] | None = (model, 0) if model is not None else None
        self._asleep = False
        self._transfer_ready = False
        self._lock = asyncio.Lock()

    @classmethod
    def from_config(cls, config: Any, options: VLLMOptions, tokenizer: Any, *, model: Any = None) -> VLLMEngine:
        require_vllm("engine.type", "engine.type: hf")
        colocated = model is not None
        if colocated:
            _check_colocatable(options, model)
            # The weight update's CUDA IPC handles reach vLLM's worker process pickled (vLLM refuses that
            # unless told); the engine is ours, in this process tree, and serves no network requests.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        arguments = AsyncEngineArgs(**engine_arguments(config, options, colocated=colocated))
        return cls(AsyncLLMEngine.from_engine_args(arguments), sleep_level=_sleep_level(config, options, colocated),
                   model=model)

    @classmethod
    def scorer(cls, config: Any, options: VLLMOptions, model_path: str) -> VLLMEngine:
        """An engine of its own that only scores prompts (`prompt_logprobs`) with `model_path`: an
        on-policy distillation teacher. It reads the run's dtype and context, one token longer (vLLM
        refuses a prompt that leaves no room for the token every request generates, and the student's
        longest sequences fill model.max_model_len). `options.sleep_level` 1 sleeps it between uses
        (`release_memory`: KV cache freed, weights kept in CPU memory); 2 would discard weights that
        no update brings back, so it is refused.
        """
        require_vllm("algorithm.policy_loss_options.teacher_engine", "teacher_engine: hf")
        if options.sleep_level == 2:
            raise UserError("The vLLM distillation teacher's sleep_level is 2, which discards its weights while it "
                            "sleeps, and a teacher is never sent new ones.",
                            hint="Set policy_loss_options.teacher_engine_options.sleep_level to 1 (weights kept in "
                                 "CPU memory between steps) or 0 (the teacher stays on the GPU).")
        model = config.model.model_copy(update={"path": model_path, "tokenizer": None,
                                                "max_model_len": config.model.max_model_len + 1})
        arguments = engine_arguments(config.model_copy(update={"model": model}), options, colocated=False)
        arguments["enable_sleep_mode"] = options.sleep_level > 0
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        return cls(AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**arguments)), sleep_level=options.sleep_level)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        async for event in self.generate_stream(prompt_ids, sampling, request_id=request_id):
            if isinstance(event, Generation):  # the stream's last item
                return event
        raise RuntimeError("the vllm engine's stream ended without its Generation")

    async def generate_stream(self, prompt_ids: list[int], sampling: SamplingParams, *,
                              request_id: str | None = None) -> AsyncGenerator[list[int] | Generation, None]:
        """vLLM's own stream (cumulative outputs) as new token ids, then the Generation.

        Per-token versions come from vLLM's `weight_versions` spans on the final output (exact: the
        engine core labels each step's output). Without them, tokens are stamped as chunks arrive:
        a chunk gets the version that was live when the *previous* chunk arrived (at submission, for
        the first). Stamping with the version at its own arrival could label tokens newer than the
        weights that sampled them: vLLM merges outputs a slow reader has not taken yet, so a chunk
        taken after an update may hold tokens sampled before it. Every token in a chunk was sampled
        after the tokens of the chunk before, so it is labelled with its true version or an older
        one, unless vLLM's delivery of an output lags behind a whole update (whose pause first waits
        for the engine to go idle): conservative, at worst one chunk per update labelled one version
        older.
        """
        await self._ready()
        final = None
        versions: list[int] = []  # per token sent so far
        stamp = self.policy_version
        async for output in self.engine.generate({"prompt_token_ids": list(prompt_ids)}, vllm_sampling(sampling),
                                                 request_id or uuid.uuid4().hex):
            arrived = self.policy_version
            final = output
            token_ids = output.outputs[0].token_ids if output.outputs else ()
            new = list(token_ids[len(versions):])
            versions += [stamp] * len(new)
            stamp = arrived
            if new:
                yield new
        if final is None or not final.outputs:
            yield Generation([], [], "abort", versions=[])
            return
        generation = to_generation(final.outputs[0])
        if generation.versions is None:
            generation.versions = versions[:len(generation.token_ids)]
        yield generation

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token_ids[i] | token_ids[:i]) for i >= 1, from vLLM's prompt log-probs (temperature 1)."""
        if len(token_ids) < 2:
            return []
        await self._ready()
        final = None
        async for output in self.engine.generate({"prompt_token_ids": list(token_ids)}, scoring_params(),
                                                 uuid.uuid4().hex):
            final = output
        if final is None:
            raise RuntimeError("vLLM returned no output for a prompt to score")
        return scored_prompt(final.prompt_logprobs, token_ids)

    # -- colocated with a trainer ------------------------------------------------------------------
    async def release_memory(self) -> None:
        """Before the trainer's update: put vLLM to sleep (`sleep_level`), freeing its GPU memory."""
        async with self._lock:
            if self.sleep_level and not self._asleep:
                await self.engine.sleep(level=self.sleep_level)
                self._asleep = True

    async def sync_weights(self, model: Any, version: int = 0) -> None:
        """After the update: load the trainer's new weights into vLLM (waking it if asleep), as `version`."""
        self._pending = (model, version)
        await self._ready()

    async def _ready(self) -> None:
        """Wake vLLM and load pending weights before a generation (or now, from `sync_weights`)."""
        if self._pending is None and not self._asleep:
            return
        async with self._lock:
            if self._pending is not None:
                # Taken before loading: a newer update set meanwhile stays pending for its own caller.
                (model, version), self._pending = self._pending, None
                await (self._load_asleep if self._asleep else self._load_awake)(model, version)
                self.policy_version = version  # after the load: tokens from now on are the new weights'
            elif self._asleep:  # released, then asked to generate without an update in between
                await self.engine.wake_up(tags=None)
                self._asleep = False

    async def _load_asleep(self, model: Any, version: int) -> None:
        """Synchronous training: nothing is in flight while vLLM sleeps through the update."""
        # Weights first: the KV cache would otherwise take the memory the copy needs.
        await self.engine.wake_up(tags=["weights"])
        await self._transfer(model, version)
        await self.engine.wake_up(tags=["kv_cache"])
        self._asleep = False
        await self._reset_prefix_cache()

    async def _load_awake(self, model: Any, version: int) -> None:
        """Asynchronous training: the update lands among requests in flight (partial rollouts).

        `keep` freezes them in vLLM's scheduler (no step runs; the pause returns once the step in
        progress has finished and its outputs are out); `clear_cache=False` because the reset must
        come after the load. The reset preempts the running requests (vLLM's reset_running_requests:
        moved back to the waiting queue, KV blocks freed, not aborted): on resume each is prefilled
        again, prompt and tokens so far, by the new weights, and continues from there. A failed load
        raises without resuming: half-loaded weights must not sample.
        """
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        await self._transfer(model, version)
        await self._reset_prefix_cache()
        await self.engine.resume_generation()

    async def _reset_prefix_cache(self) -> None:
        # Cached prefix blocks (and running requests' blocks) hold keys and values the old weights computed.
        if not await self.engine.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLM did not reset its prefix cache after a weight update; refusing to roll out "
                               "from KV blocks the old weights computed")

    async def _transfer(self, model: Any, version: int) -> None:
        """The trainer's parameters into vLLM's model, by CUDA IPC through vLLM's weight-transfer engine.

        `version` becomes vLLM's weight-version label: the outputs of every step from now on carry it.
        """
        import torch
        from vllm.distributed.weight_transfer.base import (
            WeightTransferInitRequest,
            WeightTransferUpdateRequest,
        )

        if not self._transfer_ready:
            await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={"packed": False}))
            self._transfer_ready = True
        with vllm_weights(model) as weights:
            shared = [tensor.contiguous() for _, tensor in weights]  # kept alive until vLLM has copied them
            on_gpu = any(tensor.is_cuda for tensor in shared)
            if on_gpu:  # LoRA merges and the optimizer's writes are done before vLLM's process reads
                torch.cuda.synchronize()
            info = ipc_update_info([name for name, _ in weights], shared, self.share)
            await self.engine.start_weight_update()
            await self.engine.update_weights(WeightTransferUpdateRequest(update_info=info))
            await self.engine.finish_weight_update(weight_version=str(version))
            del shared
        if on_gpu:  # release the IPC references vLLM's worker has dropped
            torch.cuda.ipc_collect()

    async def aclose(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


def require_vllm(key: str, alternative: str) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise UserError(f"{key} is 'vllm' but vLLM is not installed.",
                        hint=f"pip install 'agenttune[vllm]' on a machine with a CUDA GPU, or use {alternative}.")


def engine_arguments(config: Any, options: VLLMOptions, *, colocated: bool) -> dict[str, Any]:
    """vLLM's `AsyncEngineArgs` for a run. Colocated: sleep mode and the CUDA IPC weight transfer."""
    from agenttune.components.engines.model_loading import resolve_model_path

    arguments: dict[str, Any] = {
        "model": resolve_model_path(config.model.path),
        "tokenizer": resolve_model_path(config.model.tokenizer or config.model.path, key="model.tokenizer"),
        "dtype": config.model.dtype,
        "max_model_len": config.model.max_model_len,
        "trust_remote_code": config.model.trust_remote_code,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "tensor_parallel_size": options.tensor_parallel_size,
        "enforce_eager": options.enforce_eager,
        "max_num_seqs": options.max_num_seqs,
        "enable_prefix_caching": options.enable_prefix_caching,
        "logprobs_mode": LOGPROBS_MODE,
    }
    if options.max_num_batched_tokens is not None:
        arguments["max_num_batched_tokens"] = options.max_num_batched_tokens
    if colocated:
        arguments["enable_sleep_mode"] = _sleep_level(config, options, colocated) > 0
        arguments["weight_transfer_config"] = {"backend": WEIGHT_TRANSFER_BACKEND}
    return arguments


def _sleep_level(config: Any, options: VLLMOptions, colocated: bool) -> int:
    """vLLM sleeps through synchronous updates only: asynchronous rollouts go on during the update."""
    synchronous = config.trainer.staleness_bound is None
    return options.sleep_level if colocated and synchronous else 0


def _check_colocatable(options: VLLMOptions, model: Any) -> None:
    if options.tensor_parallel_size != 1:
        raise UserError(
            f"engine.tensor_parallel_size is {options.tensor_parallel_size}, but with the local backbone vLLM runs "
            "on the trainer's one GPU and receives its weights by CUDA IPC, one GPU to one GPU.",
            hint="Remove engine.tensor_parallel_size (1), or serve a larger model with `vllm serve` and use "
                 "engine.type: openai.")
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise UserError(
            f"engine.type is 'vllm', but the policy being trained is on {device.type!r}: vLLM shares the "
            "trainer's weights on one CUDA GPU.",
            hint="Train on a CUDA GPU (local.device: cuda or auto), or use engine.type: hf.")


def ipc_update_info(names: list[str], tensors: list[Any], handle_of: Callable[[Any], tuple[str, tuple]]) -> dict:
    """The update payload of vLLM's IPC weight transfer (`IPCWeightTransferUpdateInfo`'s fields).

    `handle_of(tensor)` gives (GPU UUID, `reduce_tensor` args). The handles travel pickled
    (`ipc_handles_pickled`): vLLM's RPC between processes carries no raw CUDA handles.
    """
    handles = []
    for tensor in tensors:
        gpu, arguments = handle_of(tensor)
        handles.append({gpu: arguments})
    return {
        "names": list(names),
        "dtype_names": [str(tensor.dtype).removeprefix("torch.") for tensor in tensors],
        "shapes": [list(tensor.shape) for tensor in tensors],
        "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode("ascii"),
    }


def _cuda_ipc_handle(tensor: Any) -> tuple[str, tuple]:
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    gpu = str(torch.cuda.get_device_properties(tensor.device).uuid)
    return gpu, reduce_tensor(tensor)[1]


def vllm_sampling(sampling: SamplingParams) -> Any:
    from vllm import SamplingParams as VLLMSamplingParams

    guide = {}
    if sampling.guide is not None:  # vLLM's structured outputs (>= 0.10.2; xgrammar by default)
        from vllm.sampling_params import StructuredOutputsParams

        field = "json" if sampling.guide.kind == "json_schema" else "structural_tag"
        guide["structured_outputs"] = StructuredOutputsParams(**{field: sampling.guide.spec})
    return VLLMSamplingParams(
        **guide,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        max_tokens=sampling.max_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        seed=sampling.seed,
        logprobs=0,  # the sampled token's logprob only
    )


def scoring_params() -> Any:
    """vLLM's SamplingParams for scoring a prompt: its own tokens' log-probs (`prompt_logprobs=0`: the
    actual token only, no alternatives), one token generated (vLLM's least; greedy, not read)."""
    from vllm import SamplingParams as VLLMSamplingParams

    return VLLMSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)


def scored_prompt(prompt_logprobs: Any, token_ids: list[int]) -> list[float]:
    """vLLM's `RequestOutput.prompt_logprobs` -> each token's log-prob after the first.

    vLLM gives one entry per prompt token, the first empty (None in the list form, {} in
    `FlatLogprobs`), then {token id: Logprob} holding at least the actual token.
    """
    entries = list(prompt_logprobs or ())
    if len(entries) != len(token_ids):
        raise RuntimeError(f"vLLM returned prompt log-probs for {len(entries)} of the prompt's {len(token_ids)} tokens")
    return [float(entry[token].logprob) for token, entry in zip(token_ids[1:], entries[1:], strict=True)]


_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length"}  # else: aborted


def to_generation(completion: Any) -> Generation:
    """vLLM's CompletionOutput -> Generation (ids, the sampled tokens' logprobs, finish reason, versions)."""
    token_ids = list(completion.token_ids)
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [float(step[token].logprob) for token, step in zip(token_ids, completion.logprobs, strict=True)]
    return Generation(token_ids, logprobs, _FINISH_REASONS.get(completion.finish_reason, "abort"),
                      versions=span_versions(completion))


def span_versions(completion: Any) -> list[int] | None:
    """Per token, the policy version of the weights that sampled it, from vLLM's `weight_versions` spans.

    None where vLLM reports none (not the final output) or its labels are not ours (vLLM's
    "default" before `sync_weights` first labelled the weights), or the spans do not cover the tokens.
    """
    versions: list[int] = []
    for span in getattr(completion, "weight_versions", None) or ():
        if not str(span.version).lstrip("-").isdigit() or span.start != len(versions):
            return None
        versions += [int(span.version)] * (span.end - span.start)
    return versions if versions and len(versions) == len(completion.token_ids) else None
