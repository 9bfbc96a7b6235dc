"""The inference engines that generate with Trinity's rollout model.

With GPUs, Trinity runs vLLM engines as Ray actors and, with `explorer.rollout_model.enable_openai_api`,
serves each one behind vLLM's OpenAI API; a workflow runner's `ModelWrapper` knows the address
(`api_address`, set by `ModelWrapper.prepare()`). The gateway's prompt token ids go to that server's
`/v1/completions` as the prompt, with vLLM's `return_token_ids`, so the generated ids and their
logprobs come back exactly as sampled — the same path as agenttune's `openai` engine in `completions`
mode, pointed at the rollout model Trinity is training. Weight syncs happen behind that server;
nothing here needs to know about them.

In Tinker mode (`model.tinker.enable`: the CPU path, see tinker_mode.py) Trinity's rollout model is a
`TinkerModel` actor holding a Tinker `SamplingClient`, and its "OpenAI address" is the hosted Tinker
service's, whatever the base URL. `TinkerSamplingEngine` samples the prompt ids through the tinker SDK
itself, from the sampler weights the actor holds now: the trainer saves them after every step and the
explorer's weight sync hands their path to the actor (`TinkerModel.sync_model_weights`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from agenttune.plugin_api import (
    Generation,
    InferenceEngine,
    OpenAIEngine,
    OpenAIEngineOptions,
    SamplingParams,
    UserError,
)


class TrinityEngine(OpenAIEngine):
    """agenttune's `InferenceEngine` on a Trinity `ModelWrapper` (token ids in, ids and logprobs out)."""

    name: ClassVar[str] = "trinity"

    @classmethod
    def for_model(cls, model: Any, *, timeout: float, transport: Any = None) -> InferenceEngine:
        """The engine for a prepared `ModelWrapper` (its OpenAI API address is known)."""
        if model.config.engine_type == "tinker":
            return TinkerSamplingEngine(model)
        address = getattr(model, "api_address", None)
        if not address:
            raise UserError("Trinity's rollout model has no OpenAI API address, so agenttune's gateway cannot "
                            "reach it.",
                            hint="Keep trinity.explorer.rollout_model.enable_openai_api true (the trinity "
                                 "backbone sets it).")
        options = OpenAIEngineOptions(base_url=f"{address.rstrip('/')}/v1", api_key=model.api_key,
                                      model=model.model_path, mode="completions", timeout=timeout)
        return cls(options, model.model_path, transport=transport)


class TinkerSamplingEngine(InferenceEngine):
    """Samples prompt ids from the weights Trinity's `TinkerModel` actor holds, through the tinker SDK.

    The SDK finds the server as Trinity's actors do (`TINKER_BASE_URL`, `TINKER_API_KEY`). Before each
    request the actor is asked for its current sampler path (one local Ray call); a sampling client is
    made once per path, so every request after a weight sync samples from the new policy.
    """

    name: ClassVar[str] = "trinity-tinker"

    def __init__(self, model: Any) -> None:
        self._actor = model.model
        self._base_model = model.config.model_path
        self._service: Any = None
        self._clients: dict[str, Any] = {}

    async def _client(self) -> Any:
        import tinker

        path = await self._actor.get_model_path.remote()
        if path not in self._clients:
            self._service = self._service or tinker.ServiceClient()
            if path == self._base_model:  # before the first sync: the base model itself
                future = self._service.create_sampling_client(base_model=path)
            else:
                future = self._service.create_sampling_client(model_path=path)
            self._clients = {path: await future}  # older policies are not sampled again
        return self._clients[path]

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        from tinker import types

        client = await self._client()
        response = await client.sample(
            prompt=types.ModelInput.from_ints(prompt_ids), num_samples=1,
            sampling_params=types.SamplingParams(
                max_tokens=sampling.max_tokens, seed=sampling.seed, temperature=sampling.temperature,
                top_k=sampling.top_k, top_p=sampling.top_p, stop=tinker_stop(sampling)))
        sequence = response.sequences[0]
        return Generation(token_ids=list(sequence.tokens), logprobs=[float(x) for x in sequence.logprobs],
                          finish_reason="length" if sequence.stop_reason == "length" else "stop")


def tinker_stop(sampling: SamplingParams) -> list[str] | list[int] | None:
    """Tinker's `stop` takes strings or token ids, not both; None keeps its end-of-sequence stop.

    The gateway always sends the end-of-turn id; a workflow's own stop strings, when it sets any, win
    (the reply then also ends at max_tokens if the model ends its turn without one).
    """
    if sampling.stop:
        return list(sampling.stop)
    if sampling.stop_token_ids:
        return list(sampling.stop_token_ids)
    return None
