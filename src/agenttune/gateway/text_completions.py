"""`POST /v1/completions`: a prompt (token ids or text) continued, scored, or both.

What an on-policy distillation teacher asks a server for (components/losses/distillation.py): the log-prob of
every prompt token, in vLLM's two shapes. `prompt_logprobs: 0` adds `choices[0].prompt_logprobs`
(`[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`); the legacy `echo: true` with
`logprobs` puts the prompt's tokens before the generated ones in `choices[0].logprobs` (the first
`token_logprobs` entry is null). `echo` with `max_tokens: 0` scores without generating. Log-probs
are the engine's at temperature 1; `top_logprobs` are not computed (null entries). These calls
are not recorded as episodes (a timeline is a chat's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agenttune.components.engines.base import InferenceEngine, SamplingParams
from agenttune.gateway.api_errors import GatewayError, bad_request
from agenttune.gateway.protocol import check_sampling
from agenttune.web.ids import random_id


@dataclass(frozen=True)
class CompletionRequest:
    prompt_ids: list[int]
    max_tokens: int
    echo: bool
    logprobs: int | None
    prompt_logprobs: int | None
    sampling: dict[str, Any]


class TextCompletions:
    def __init__(self, engine: InferenceEngine, tokenizer: Any, *, max_model_len: int, model_name: str):
        self.engine, self.tokenizer = engine, tokenizer
        self.max_model_len, self.model_name = max_model_len, model_name
        eos = tokenizer.eos_token_id
        self.stop_token_ids = (eos,) if eos is not None else ()

    async def answer(self, body: Any) -> dict[str, Any]:
        request = self.parse(body)
        scored = request.echo or request.prompt_logprobs is not None
        prompt_scores = await self._score(request.prompt_ids) if scored else None
        generated, generated_logprobs, finish = await self._generate(request)
        choice: dict[str, Any] = {
            "index": 0, "text": self._text(request.prompt_ids if request.echo else []) + self._text(
                generated[:-1] if generated and generated[-1] in self.stop_token_ids else generated),
            "logprobs": None, "finish_reason": finish, "prompt_token_ids": request.prompt_ids, "token_ids": generated,
            "prompt_logprobs": None if request.prompt_logprobs is None else self._prompt_entries(
                request.prompt_ids, prompt_scores or []),
        }
        if request.logprobs is not None:
            ids, values = list(generated), list(generated_logprobs)
            if request.echo:
                ids, values = request.prompt_ids + ids, [None, *(prompt_scores or [])] + values
            choice["logprobs"] = self._logprobs(ids, values)
        prompt_tokens = len(request.prompt_ids)
        return {"id": random_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(generated),
                          "total_tokens": prompt_tokens + len(generated)}}

    def parse(self, body: Any) -> CompletionRequest:
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.")
        if body.get("stream"):
            raise bad_request("`stream` is not supported on /v1/completions here; send stream: false.", param="stream")
        max_tokens = _integer(body, "max_tokens", 16, low=0) or 0
        logprobs = _integer(body, "logprobs", None, low=0, high=20)
        prompt_logprobs = _integer(body, "prompt_logprobs", None, low=0)
        if prompt_logprobs:
            raise bad_request("This server returns the prompt tokens' own log-probs only: send prompt_logprobs: 0.",
                              param="prompt_logprobs")
        echo = body.get("echo", False)
        if not isinstance(echo, bool):
            raise bad_request("`echo` must be a boolean.", param="echo")
        prompt_ids = self._prompt_ids(body.get("prompt"))
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise bad_request(f"The prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                              f"model's context of {self.max_model_len} tokens.", param="prompt")
        if (echo or prompt_logprobs is not None) and not self.engine.scores_prompts:
            raise bad_request(f"The {self.engine.name!r} engine cannot score prompts (echo, prompt_logprobs).",
                              param="prompt_logprobs")
        check_sampling(body)
        sampling = {key: body[key] for key in ("temperature", "top_p", "seed") if body.get(key) is not None}
        return CompletionRequest(prompt_ids, max_tokens, echo, logprobs, prompt_logprobs, sampling)

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str) and prompt:
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        vocabulary = len(self.tokenizer)
        if (isinstance(prompt, list) and prompt and all(type(token) is int for token in prompt)
                and all(0 <= token < vocabulary for token in prompt)):
            return prompt
        raise bad_request(f"`prompt` must be one non-empty string or one non-empty list of token ids below "
                          f"{vocabulary} (batches of prompts are not supported: send one request each).",
                          param="prompt")

    async def _score(self, token_ids: list[int]) -> list[float]:
        try:
            return await self.engine.prompt_logprobs(token_ids)
        except Exception as error:
            raise GatewayError(502, f"The engine could not score the prompt: {type(error).__name__}: {error}",
                               code="engine_error") from error

    async def _generate(self, request: CompletionRequest) -> tuple[list[int], list[float | None], str]:
        if request.max_tokens == 0:
            return [], [], "length"
        sampling = SamplingParams(max_tokens=request.max_tokens, stop_token_ids=self.stop_token_ids,
                                  **request.sampling)
        try:
            generation = await self.engine.generate(request.prompt_ids, sampling)
        except Exception as error:
            raise GatewayError(502, f"The engine failed: {type(error).__name__}: {error}",
                               code="engine_error") from error
        values: list[float | None] = (list(generation.logprobs) if generation.logprobs is not None
                                      else [None] * len(generation.token_ids))
        return list(generation.token_ids), values, generation.finish_reason

    def _text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids) if token_ids else ""

    def _prompt_entries(self, token_ids: list[int], scores: list[float]) -> list[dict[str, Any] | None]:
        """vLLM's shape: None for the first token, then {id: {logprob, rank, decoded_token}} (rank unknown)."""
        return [None] + [{str(token): {"logprob": score, "rank": None, "decoded_token": self._text([token])}}
                         for token, score in zip(token_ids[1:], scores, strict=True)]

    def _logprobs(self, token_ids: list[int], values: list[float | None]) -> dict[str, Any]:
        tokens = [self._text([token]) for token in token_ids]
        offsets, offset = [], 0
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": [None] * len(tokens),
                "text_offset": offsets}


def _integer(body: dict[str, Any], key: str, default: int | None, *, low: int, high: int | None = None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if type(value) is not int or value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise bad_request(f"`{key}` must be an integer {bounds} (got {value!r}).", param=key)
    return value
