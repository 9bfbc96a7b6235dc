"""`vllm`: generation by an in-process vLLM engine, for GPU machines (`pip install 'agenttune[vllm]'`).

    engine:
      type: vllm
      gpu_memory_utilization: 0.4   # leave room for the trainer when it shares the GPU

Prompt token ids go in, generated ids and their logprobs come out exactly as vLLM sampled them.

With the local backbone, vLLM keeps its own copy of the weights; after every training step the
backbone calls `load_weights(model)`, which writes the trainer's weights into vLLM's model in place
(vLLM runs in this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, as TRL's "colocate" mode does).
`train/logprob_mismatch` shows at once if the two ever disagree.

Status: written against vLLM's documented `AsyncLLMEngine` API (0.10 and later); agenttune's CI has no
GPU, so only the translation of requests and outputs is tested (with a stand-in for vLLM). The
in-place weight load reaches into vLLM internals that change between releases; when they are not
where expected, `load_weights` raises instead of letting rollouts use stale weights.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.engine import FinishReason, Generation, InferenceEngine, SamplingParams
from agenttune.errors import UserError


class VLLMOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(default=0.4, gt=0, le=1, description="GPU memory fraction vLLM may take.")
    tensor_parallel_size: int = Field(default=1, gt=0, description="GPUs per model (the local backbone: 1).")
    enforce_eager: bool = Field(default=True, description="Skip CUDA graphs: slower decoding, faster start and weight loads.")
    max_num_seqs: int = Field(default=256, gt=0, description="Most sequences decoded together.")


class VLLMEngine(InferenceEngine):
    name: ClassVar[str] = "vllm"
    Options: ClassVar[type[BaseModel]] = VLLMOptions

    def __init__(self, engine: Any):
        self.engine = engine

    @classmethod
    def from_config(cls, config: Any, options: VLLMOptions, tokenizer: Any, *, model: Any = None) -> VLLMEngine:
        if importlib.util.find_spec("vllm") is None:
            raise UserError("engine.type is 'vllm' but vLLM is not installed.",
                            hint="pip install 'agenttune[vllm]' on a machine with a CUDA GPU, or use engine.type: hf.")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # weights live in this process
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        from agenttune.model_loading import resolve_model_path

        arguments = AsyncEngineArgs(
            model=resolve_model_path(config.model.path),
            tokenizer=resolve_model_path(config.model.tokenizer or config.model.path, key="model.tokenizer"),
            dtype=config.model.dtype,
            max_model_len=config.model.max_model_len,
            trust_remote_code=config.model.trust_remote_code,
            gpu_memory_utilization=options.gpu_memory_utilization,
            tensor_parallel_size=options.tensor_parallel_size,
            enforce_eager=options.enforce_eager,
            max_num_seqs=options.max_num_seqs,
        )
        return cls(AsyncLLMEngine.from_engine_args(arguments))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        final = None
        async for output in self.engine.generate({"prompt_token_ids": list(prompt_ids)}, vllm_sampling(sampling),
                                                 request_id or uuid.uuid4().hex):
            final = output
        if final is None or not final.outputs:
            return Generation([], [], "abort")
        return to_generation(final.outputs[0])

    def load_weights(self, model: Any) -> None:
        """Copy the trainer's current weights into vLLM's model (called after each training step)."""
        target = _vllm_model(self.engine)
        target.load_weights(((name, tensor.detach()) for name, tensor in _merged_state(model).items()))
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:  # cached prefixes were computed with the old weights
            result = reset()
            if hasattr(result, "close"):  # a coroutine in async engines; drop it if no loop awaits it
                result.close()

    async def aclose(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


def vllm_sampling(sampling: SamplingParams) -> Any:
    from vllm import SamplingParams as VLLMSamplingParams

    return VLLMSamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        max_tokens=sampling.max_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        seed=sampling.seed,
        logprobs=0,  # the sampled token's logprob only
    )


_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length"}  # else: aborted


def to_generation(completion: Any) -> Generation:
    """vLLM's CompletionOutput -> Generation (ids, the sampled tokens' logprobs, finish reason)."""
    token_ids = list(completion.token_ids)
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [float(step[token].logprob) for token, step in zip(token_ids, completion.logprobs, strict=True)]
    return Generation(token_ids, logprobs, _FINISH_REASONS.get(completion.finish_reason, "abort"))


def _vllm_model(engine: Any) -> Any:
    """The torch module vLLM decodes with; only reachable when vLLM runs in this process."""
    paths = (
        ("engine_core", "engine_core", "model_executor", "driver_worker", "worker", "model_runner", "model"),
        ("engine", "model_executor", "driver_worker", "model_runner", "model"),
    )
    for path in paths:
        node = engine
        for attribute in path:
            node = getattr(node, attribute, None)
            if node is None:
                break
        if node is not None and hasattr(node, "load_weights"):
            return node
    raise RuntimeError("cannot reach vLLM's model to load new weights into (this vLLM version keeps it elsewhere); "
                       "refusing to roll out with stale weights")


def _merged_state(model: Any) -> dict[str, Any]:
    """The full model's weights under Hugging Face names (LoRA adapters merged in)."""
    if hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter"):
        model.merge_adapter()
        try:
            base = model.get_base_model()
            return {name.replace(".base_layer", ""): tensor.clone() for name, tensor in base.state_dict().items()
                    if "lora_" not in name}
        finally:
            model.unmerge_adapter()
    return model.state_dict()
