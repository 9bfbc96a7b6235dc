"""The inference engine that generates with Trinity's rollout model.

Trinity runs vLLM engines as Ray actors and, with `explorer.rollout_model.enable_openai_api`, serves
each one behind vLLM's OpenAI API; a workflow runner's `ModelWrapper` knows the address
(`api_address`, set by `ModelWrapper.prepare()`). The gateway's prompt token ids go to that server's
`/v1/completions` as the prompt, with vLLM's `return_token_ids`, so the generated ids and their
logprobs come back exactly as sampled — the same path as agenttune's `openai` engine in `completions`
mode, pointed at the rollout model Trinity is training. Weight syncs happen behind that server;
nothing here needs to know about them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agenttune.plugin_api import OpenAIEngine, OpenAIEngineOptions, UserError


class TrinityEngine(OpenAIEngine):
    """agenttune's `InferenceEngine` on a Trinity `ModelWrapper` (token ids in, ids and logprobs out)."""

    name: ClassVar[str] = "trinity"

    @classmethod
    def for_model(cls, model: Any, *, timeout: float, transport: Any = None) -> TrinityEngine:
        """The engine for a prepared `ModelWrapper` (its OpenAI API address is known)."""
        address = getattr(model, "api_address", None)
        if not address:
            raise UserError("Trinity's rollout model has no OpenAI API address, so agenttune's gateway cannot "
                            "reach it.",
                            hint="Keep trinity.explorer.rollout_model.enable_openai_api true (the trinity "
                                 "backbone sets it).")
        options = OpenAIEngineOptions(base_url=f"{address.rstrip('/')}/v1", api_key=model.api_key,
                                      model=model.model_path, mode="completions", timeout=timeout)
        return cls(options, model.model_path, transport=transport)
