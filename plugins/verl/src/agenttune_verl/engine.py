"""An inference engine that generates through verl's rollout servers (`server_manager.generate`).

The gateway hands it the exact prompt token ids it rendered; verl's vLLM servers return the sampled
ids and their logprobs, which are what gets trained. Every call of one episode carries the same
request id (the episode's), so verl's load balancer keeps the episode on one server and vLLM's prefix
cache serves the growing conversation.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar
from uuid import uuid4

from agenttune.plugin_api import FinishReason, Generation, InferenceEngine, SamplingParams

# TokenOutput.stop_reason ("completed", "length", "aborted", or None) -> agenttune's finish reason
_FINISH_REASONS: dict[str | None, FinishReason] = {
    "completed": "stop",
    "stop": "stop",
    None: "stop",
    "length": "length",
    "aborted": "abort",
    "abort": "abort",
}


@dataclass
class RequestStats:
    """What verl reported about one episode's generations."""

    calls: int = 0
    generate_s: float = 0.0
    num_preempted: int = 0
    # model versions (verl's global_steps) that generated the tokens: verl's V1 trainer drops
    # trajectories that span too many versions (off-policy control)
    versions: list[int] = field(default_factory=list)

    @property
    def min_global_steps(self) -> int | None:
        return min(self.versions) if self.versions else None

    @property
    def max_global_steps(self) -> int | None:
        return max(self.versions) if self.versions else None


class VerlEngine(InferenceEngine):
    """Generates with verl's `LLMServerClient` (what verl hands an agent loop as `server_manager`).

    Built by the agent loop worker, not from `engine:` in the config. `stats(request_id)` holds what
    verl reported for one episode; `forget(request_id)` drops it when the episode is done.
    """

    name: ClassVar[str] = "verl"

    def __init__(self, server_manager: Any):
        self.server_manager = server_manager
        self._stats: dict[str, RequestStats] = defaultdict(RequestStats)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        request_id = request_id or uuid4().hex
        started = time.perf_counter()
        output = await self.server_manager.generate(
            request_id=request_id, prompt_ids=list(prompt_ids), sampling_params=self.sampling_params(sampling)
        )
        self._remember(request_id, output, time.perf_counter() - started)
        # As verl sent them: the gateway refuses missing or misaligned logprobs (they would be trained wrong).
        logprobs = list(output.log_probs) if output.log_probs is not None else None
        finish = _FINISH_REASONS.get(output.stop_reason, "stop")
        return Generation(token_ids=list(output.token_ids), logprobs=logprobs, finish_reason=finish,
                          metadata={"stop_reason": output.stop_reason})

    @staticmethod
    def sampling_params(sampling: SamplingParams) -> dict[str, Any]:
        """The `sampling_params` dict verl's servers take (the keys verl's own agent loops send)."""
        params: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_tokens": sampling.max_tokens,
            "repetition_penalty": 1.0,
            "logprobs": True,  # the sampled tokens' logprobs are recorded on every sample
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        return params

    def stats(self, request_id: str) -> RequestStats:
        return self._stats.get(request_id) or RequestStats()

    def forget(self, request_id: str) -> None:
        self._stats.pop(request_id, None)

    def _remember(self, request_id: str, output: Any, seconds: float) -> None:
        stats = self._stats[request_id]
        stats.calls += 1
        stats.generate_s += seconds
        stats.num_preempted += int(output.num_preempted or 0)
        extra = output.extra_fields or {}
        stats.versions += [int(extra[key]) for key in ("min_global_steps", "max_global_steps", "global_steps")
                           if extra.get(key) is not None]
