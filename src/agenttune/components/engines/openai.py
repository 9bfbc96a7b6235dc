"""`openai`: forward generation to an OpenAI-compatible server (`vllm serve`, SGLang, a hosted model).

Two modes:

* `completions` (default): the gateway's prompt token ids go to `/v1/completions` as the prompt,
  with vLLM's `return_token_ids`; the server's generated ids and logprobs come back exactly, so
  episodes are trainable. Needs a server that accepts token-id prompts (vLLM, SGLang).
* `chat`: the request's messages go to `/v1/chat/completions` (for servers that only speak chat,
  e.g. hosted APIs). The server renders its own template, so the gateway cannot merge turns; the
  reply's token ids are recorded when the server returns them (vLLM `return_token_ids`), otherwise
  only the text is kept and the episode is marked not trainable.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttune.components.engines.base import FinishReason, Generation, InferenceEngine, SamplingParams
from agenttune.errors import UserError


class OpenAIEngineOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(default="http://127.0.0.1:8000/v1", description="The server's OpenAI base URL (ends in /v1).")
    api_key: str = Field(default="EMPTY", description="API key for the server.")
    model: str | None = Field(default=None, description="Model name to request; default: model.path.")
    mode: Literal["completions", "chat"] = Field(default="completions", description="completions: token ids in and out (vLLM, SGLang); chat: messages (any server).")
    timeout: float = Field(default=600.0, gt=0, description="Seconds per request.")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra fields sent with every request.")


class OpenAIEngine(InferenceEngine):
    name: ClassVar[str] = "openai"
    # Guides go to the server as vLLM's `structured_outputs` (a server without it ignores or refuses them).
    enforces_guides: ClassVar[bool] = True
    scores_prompts: ClassVar[bool] = True  # when the server returns prompt logprobs (vLLM, agenttune serve)
    Options: ClassVar[type[BaseModel]] = OpenAIEngineOptions

    def __init__(self, options: OpenAIEngineOptions, model_name: str, *, transport: Any = None):
        import httpx

        self.options = options
        self.model_name = options.model or model_name
        self.wants_messages = options.mode == "chat"
        self._client = httpx.AsyncClient(
            base_url=options.base_url.rstrip("/") + "/", timeout=options.timeout, transport=transport,
            headers={"Authorization": f"Bearer {options.api_key}"},
        )

    @classmethod
    def from_config(cls, config: Any, options: OpenAIEngineOptions, tokenizer: Any, *,
                    model: Any = None) -> OpenAIEngine:
        if not (options.model or config.model.path):
            raise UserError("engine.model is not set (the openai engine needs a model name to request).",
                            hint="Set engine.model to the served model's name, or model.path.")
        return cls(options, options.model or config.model.path)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        body = {"model": self.model_name, "prompt": list(prompt_ids), "logprobs": 1, "return_token_ids": True,
                **_sampling_fields(sampling), **self.options.extra_body}
        choice = (await self._post("completions", body))["choices"][0]
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        return _generation(choice, token_ids, logprobs, choice.get("text", ""))

    async def generate_stream(self, prompt_ids: list[int], sampling: SamplingParams, *,
                              request_id: str | None = None) -> AsyncGenerator[list[int] | Generation, None]:
        """Completions mode: the server's own stream (`stream: true`; vLLM sends each chunk's token ids
        with `return_token_ids`), passed on as it comes. Chat mode answers whole."""
        if self.wants_messages:
            yield await self.generate(prompt_ids, sampling, request_id=request_id)
            return
        body = {"model": self.model_name, "prompt": list(prompt_ids), "logprobs": 1, "return_token_ids": True,
                "stream": True, **_sampling_fields(sampling), **self.options.extra_body}
        token_ids: list[int] = []
        logprobs: list[Any] = []
        texts: list[str] = []
        last: dict[str, Any] = {}
        async with self._client.stream("POST", "completions", json=body) as response:
            if response.status_code >= 400:
                raise RuntimeError(f"the model server at {self.options.base_url} answered {response.status_code}: "
                                   f"{(await response.aread()).decode(errors='replace')[:500]}")
            async for choice in _stream_choices(response):
                last = choice
                texts.append(choice.get("text") or "")
                logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
                new_ids = list(choice.get("token_ids") or [])
                if new_ids:
                    token_ids += new_ids
                    yield new_ids
        yield _generation(last, token_ids, logprobs if token_ids else None, "".join(texts))

    async def generate_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                            sampling: SamplingParams) -> tuple[Generation, list[int] | None]:
        """Chat mode: the server renders the prompt. Returns the generation and the prompt ids, if sent."""
        body: dict[str, Any] = {"model": self.model_name, "messages": messages, "logprobs": True,
                                "return_token_ids": True, **_sampling_fields(sampling), **self.options.extra_body}
        if tools:
            body["tools"] = tools
        reply = await self._post("chat/completions", body)
        choice = reply["choices"][0]
        content = [entry.get("logprob") for entry in ((choice.get("logprobs") or {}).get("content") or [])]
        message = choice.get("message") or {}
        generation = _generation(choice, choice.get("token_ids"), content or None, _chat_text(message))
        return generation, reply.get("prompt_token_ids") or choice.get("prompt_token_ids")

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """The server's log-probs of the prompt's own tokens: vLLM's `prompt_logprobs: 0`, and the legacy
        `echo` with `logprobs` for servers without it. `max_tokens: 0` with `echo` generates nothing (vLLM,
        agenttune serve), so a sequence as long as the context still fits."""
        body = {"model": self.model_name, "prompt": list(token_ids), "max_tokens": 0, "temperature": 1.0,
                "prompt_logprobs": 0, "echo": True, "logprobs": 0, **self.options.extra_body}
        choice = (await self._post("completions", body))["choices"][0]
        return prompt_token_logprobs(choice, token_ids, self.options.base_url)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._client.post(path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"the model server at {self.options.base_url} answered {response.status_code}: "
                               f"{response.text[:500]}")
        return response.json()


async def _stream_choices(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The first choice of each server-sent event (usage-only chunks have none)."""
    import json

    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        choices = json.loads(data).get("choices") or []
        if choices:
            yield choices[0]


def _sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                              "top_p": sampling.top_p, "skip_special_tokens": False}
    if sampling.top_k > 0:
        fields["top_k"] = sampling.top_k
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        fields["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    if sampling.guide is not None:  # vLLM's structured outputs field (vLLM >= 0.10.2)
        key = "json" if sampling.guide.kind == "json_schema" else "structural_tag"
        fields["structured_outputs"] = {key: sampling.guide.spec}
    return fields


def _generation(choice: dict[str, Any], token_ids: list[int] | None, logprobs: list[Any] | None,
                text: str) -> Generation:
    finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
    if not token_ids:  # the server gave text only: keep it, the episode is not trainable
        return Generation([], None, finish, text=text)
    # Passed on as the server sent them (a missing entry as NaN): the gateway refuses what cannot be trained.
    reported = [math.nan if value is None else float(value) for value in logprobs] if logprobs is not None else None
    return Generation(list(token_ids), reported, finish, text=text)


def prompt_token_logprobs(choice: dict[str, Any], token_ids: list[int], server: str) -> list[float]:
    """log p(token_ids[i] | before) for i >= 1 from a /v1/completions choice: vLLM's `prompt_logprobs`
    ([None, {"<id>": {"logprob": ...}}, ...]) or, failing that, the echoed `logprobs.token_logprobs`."""
    wanted = len(token_ids) - 1
    values: list[Any] = []
    entries = choice.get("prompt_logprobs")
    if entries:
        for token, entry in zip(token_ids[1:], entries[1:], strict=False):
            found = (entry or {}).get(str(token)) or (entry or {}).get(token)
            values.append(found.get("logprob") if isinstance(found, dict) else found)
    else:
        echoed = (choice.get("logprobs") or {}).get("token_logprobs") or []
        values = list(echoed[1:len(token_ids)])
    if len(values) != wanted or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise UserError(
            f"The teacher server at {server} did not return the log-probabilities of the prompt's tokens (neither "
            "vLLM's `prompt_logprobs` nor `echo` with `logprobs` in its /v1/completions answer; got "
            f"{len(values)} usable values of {wanted}). On-policy distillation needs the teacher's log-probability "
            "of every token the student sampled.",
            hint="Serve the teacher with `vllm serve TEACHER` or `agenttune serve --model TEACHER` (both return "
                 "them); hosted chat APIs do not. The teacher must use the student's tokenizer.")
    return [float(value) for value in values]


def _chat_text(message: dict[str, Any]) -> str:
    """The reply as the model wrote it, as far as a chat server lets us see (tool calls in Hermes form)."""
    import json

    parts = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        parts.append(f"<think>\n{reasoning}\n</think>\n\n")
    parts.append(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        parts.append(f'\n<tool_call>\n{{"name": {json.dumps(function.get("name"))}, "arguments": {arguments}}}\n</tool_call>')
    return "".join(parts)
