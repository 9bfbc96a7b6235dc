"""agenttune's `hf` engine as verl's rollout, for runs without vLLM (`verl.trainer.device=cpu`).

verl's rollout has two halves, and this module gives both (registered in cpu.py):

- `HFReplica` (a verl `RolloutReplica`): one Ray actor per replica, `HFRolloutServer`, that runs
  agenttune's `HFEngine` on the model and answers verl's token-in/token-out `generate` calls from the
  agent loops (through verl's `LLMServerClient` and load balancer, as a vLLM server would);
- `HFServerAdapter` (a verl `BaseRollout`), which verl builds inside each trainer worker: verl's
  checkpoint engine (`naive`, the trainer and rollout colocated) hands it the trainer's weights after
  every step, and the replica's leader rank sends them to the server, which loads them between two decode
  steps and samples as the new policy version (`extra_fields.global_steps`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import ray
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

from agenttune.plugin_api import HFEngine, SamplingParams, get_logger

log = get_logger("verl.hf_rollout")

# agenttune finish reason -> TokenOutput.stop_reason (what verl's vLLM server reports)
_STOP_REASONS = {"stop": "completed", "length": "length", "abort": "aborted"}


def server_name(replica_rank: int) -> str:
    return f"agenttune_hf_server_{replica_rank}"


def rollout_world_size(config: Any) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


class HFRolloutServer:
    """A Ray actor: one `HFEngine` serving a replica (continuous batching over the agent loops' requests)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        self.config = omega_conf_to_dataclass(config)
        self.replica_rank = replica_rank
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)  # as verl's servers do
        model, tokenizer = _load(model_config)
        self.staging, _ = _load(model_config, tokenizer=tokenizer)  # where the trainer's weights land first
        self.engine = HFEngine(model, tokenizer, max_model_len=self.config.max_model_len, cuda_graphs=False,
                               cpu_threads=_threads())
        self.global_steps: int | None = None

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       **unused: Any) -> TokenOutput:
        """verl's server call (`LLMServerClient.generate`); image/video/priority keywords are not used."""
        sampling = _sampling(sampling_params, self.config, len(prompt_ids))
        started = self.global_steps
        generation = await self.engine.generate(list(prompt_ids), sampling, request_id=request_id)
        # In asynchronous modes a weight update can land mid-generation (between two decode steps): verl's
        # off-policy bound reads the oldest and newest versions that sampled the reply.
        versions: Sequence[int | None] = generation.versions or [started, self.global_steps]
        return TokenOutput(token_ids=list(generation.token_ids), log_probs=generation.logprobs,
                           stop_reason=_STOP_REASONS.get(generation.finish_reason, "completed"),
                           extra_fields={"global_steps": self.global_steps, "min_global_steps": _min(versions),
                                         "max_global_steps": _max(versions)})

    async def update_weights(self, tensors: dict[str, Any], global_steps: int | None) -> None:
        """Load the trainer's full weights, then swap them into the engine between two decode steps."""
        missing, unexpected = self.staging.load_state_dict(tensors, strict=False)
        if unexpected or set(missing) - _tied_names(self.staging):
            raise ValueError(f"the trainer's weights do not fit the served model: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        await self.engine.sync_weights(self.staging, version=int(global_steps or 0))
        self.global_steps = global_steps
        log.info("rollout weights updated", replica=self.replica_rank, global_steps=global_steps,
                 tensors=len(tensors))

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """The served policy's logprob of each token after the first (what tests compare with the trainer's)."""
        return await self.engine.prompt_logprobs(list(token_ids))

    # What verl's replicas and checkpoint manager call around generation: on CPU there is no device memory
    # to free or restore, and the synchronous trainer never calls generate during a weight update.
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}


class HFReplica(RolloutReplica):
    """A verl rollout replica whose server is an `HFRolloutServer` beside the trainer's workers."""

    async def launch_servers(self) -> None:
        server = ray.remote(HFRolloutServer).options(
            name=server_name(self.replica_rank), max_concurrency=self.max_concurrency, num_cpus=0,
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.__ray_ready__.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = server_name(self.replica_rank)  # a key for verl's load balancer; no HTTP

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        results = await asyncio.gather(*[s.abort_all_requests.remote(reject_request) for s in self.servers])
        return {"aborted_count": 0, "request_ids": [], "server_results": results}


class HFServerAdapter(BaseRollout):
    """verl's rollout inside a trainer worker: hands the checkpoint engine's weights to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank, size = int(os.environ["RANK"]), rollout_world_size(self.config)
        self.replica_rank = rank // size if replica_rank == -1 else replica_rank
        self.is_leader = rank % size == 0  # the others take part in the collective weight gather only
        self.server: Any = None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the agenttune_hf rollout takes full named tensors, not {wire_format!r}")
        tensors = {}
        async for name, tensor in ensure_async_iterator(weights):
            if self.is_leader:  # every rank iterates: each tensor is gathered collectively
                tensors[name] = tensor.detach().to("cpu", copy=True)
        if self.is_leader:
            await self._server().update_weights.remote(tensors, kwargs.get("global_steps"))

    async def resume(self, tags: list[str]) -> None: ...

    async def release(self) -> None: ...

    def _server(self) -> Any:
        if self.server is None:
            self.server = ray.get_actor(server_name(self.replica_rank))
        return self.server


def _load(model_config: Any, tokenizer: Any = None) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_config.local_path or model_config.path
    trust = bool(model_config.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust,
                                                 attn_implementation="sdpa")
    model.eval()
    if tokenizer is None:
        tokenizer_path = model_config.local_tokenizer_path or model_config.tokenizer_path or path
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust)
    return model, tokenizer


def _min(versions: Sequence[int | None]) -> int | None:
    known = [version for version in versions if version is not None]
    return min(known) if known else None


def _max(versions: Sequence[int | None]) -> int | None:
    known = [version for version in versions if version is not None]
    return max(known) if known else None


def _tied_names(model: Any) -> set[str]:
    """Parameters a state dict may omit because they share storage with another (tied embeddings)."""
    keys = getattr(model, "_tied_weights_keys", None) or []
    return set(keys if isinstance(keys, list | tuple | set) else keys.keys())


def _threads() -> int:
    """Half the cores for decoding: the trainer's worker shares the machine (the hf engine's rule for a shared
    model, components/engines/hf.py)."""
    return max(1, (os.cpu_count() or 2) // 2)


def _sampling(params: dict[str, Any], config: Any, prompt_len: int) -> SamplingParams:
    """verl's vLLM-style sampling dict -> agenttune's SamplingParams (the keys verl's agent loops send)."""
    room = max(1, config.max_model_len - prompt_len) if config.max_model_len else None
    max_tokens = int(params.get("max_tokens") or params.get("max_new_tokens") or config.response_length)
    return SamplingParams(
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=int(params.get("top_k", -1)),
        max_tokens=min(max_tokens, room) if room else max_tokens,
        stop=tuple(params.get("stop") or ()),
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        seed=params.get("seed"),
    )
