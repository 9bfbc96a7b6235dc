"""A recording probe for tests/test_cpu_run.py, loaded by verl itself in each of its processes through
`VERL_USE_EXTERNAL_MODULES=verl_probe` (verl's hook for external modules). It changes nothing: it wraps two
methods to write down, as JSON lines under `$VERL_PROBE_DIR` (one file per process):

- `sampled-<pid>.jsonl`: every generation of agenttune's hf engine, which only the `agenttune_hf` rollout
  server runs here (the prompt ids it was given, the ids it sampled, their logprobs, its policy version);
- `trained-<pid>.jsonl`: every batch verl's actor worker trains on (`update_actor`): each sample's prompt and
  response ids, response mask, token-level rewards and rollout logprobs, as verl's trainer hands them over.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

PROBE_DIR = os.environ.get("VERL_PROBE_DIR")
TRAINED_FIELDS = ("prompts", "responses", "response_mask", "rm_scores", "rollout_log_probs", "advantages")


def _write(kind: str, record: dict[str, Any]) -> None:
    path = Path(PROBE_DIR) / f"{kind}-{os.getpid()}.jsonl"
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")


def _rows(tensor: Any) -> list[list[float]]:
    if getattr(tensor, "is_nested", False):
        return [row.tolist() for row in tensor.unbind()]
    return tensor.tolist()


def _batch(data: Any) -> Any:
    """The TensorDict the actor trains on: verl's V1 trainer passes TransferQueue metadata, which the worker
    resolves into the batch (read here the way verl's own bridge reads it; reading consumes nothing)."""
    from verl.utils import transferqueue_utils

    if isinstance(data, transferqueue_utils.BatchMeta | transferqueue_utils.KVBatchMeta):
        return transferqueue_utils._meta_to_realdata(data)
    return data


def _record_generations() -> None:
    # agenttune's engine class, not the server's module: that one imports verl, which is importing this probe
    from agenttune.plugin_api import HFEngine

    generate = HFEngine.generate

    @functools.wraps(generate)
    async def recorded(self: Any, prompt_ids: list[int], sampling: Any, **kwargs: Any) -> Any:
        generation = await generate(self, prompt_ids, sampling, **kwargs)
        _write("sampled", {"prompt_ids": list(prompt_ids), "token_ids": list(generation.token_ids),
                           "log_probs": generation.logprobs, "policy_version": self.policy_version})
        return generation

    HFEngine.generate = recorded


def _record_training() -> None:
    from verl.workers.engine_workers import ActorRolloutRefWorker

    update_actor = ActorRolloutRefWorker.update_actor

    @functools.wraps(update_actor)  # keeps verl's dispatch attributes (they live in the function's __dict__)
    def recorded(self: Any, data: Any) -> Any:
        batch = _batch(data)
        fields = {name: _rows(batch[name]) for name in TRAINED_FIELDS if name in batch.keys()}
        _write("trained", {"fields": fields, "keys": sorted(str(key) for key in batch.keys())})
        return update_actor(self, data)

    ActorRolloutRefWorker.update_actor = recorded


if PROBE_DIR:
    _record_generations()
    _record_training()
