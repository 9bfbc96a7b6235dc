"""A fake of the vLLM OpenAI server Trinity runs for each rollout engine (`enable_openai_api: true`).

It is a real HTTP server on loopback that speaks the part of vLLM's API the trinity backbone uses:
`GET /health` (what `ModelWrapper.prepare()` polls) and `POST /v1/completions` with a token-id prompt
and `return_token_ids`. The model is scripted: `reply(prompt_text)` picks the text, the tiny model's
real tokenizer turns it into token ids (plus `<|im_end|>`, as vLLM returns the stop token), and each
token gets a distinct logprob. Every call is recorded, so tests can compare what the trainer would
see with what the "model" produced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Call:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    body: dict[str, Any]


@dataclass
class FakeVLLMServer:
    tokenizer: Any
    reply: Callable[[str], str | None]  # None: answer HTTP 500, as a crashed engine would
    calls: list[Call] = field(default_factory=list)

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        async def health(request: Any) -> Response:
            return Response(status_code=200)

        async def completions(request: Any) -> JSONResponse:
            body = await request.json()
            prompt = body["prompt"]
            if not (isinstance(prompt, list) and all(isinstance(token, int) for token in prompt)):
                return JSONResponse({"error": "this fake only takes token-id prompts"}, status_code=400)
            text = self.reply(self.tokenizer.decode(prompt))
            if text is None:
                return JSONResponse({"error": {"message": "engine crashed (scripted)"}}, status_code=500)
            token_ids = self.tokenizer.encode(text, add_special_tokens=False)
            token_ids = token_ids[: body["max_tokens"] - 1] + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
            # distinct, recognisable values: call n, token i -> -(n + 1) / 10 - i / 1000
            logprobs = [-(len(self.calls) + 1) / 10 - index / 1000 for index in range(len(token_ids))]
            self.calls.append(Call(list(prompt), token_ids, logprobs, body))
            choice = {
                "index": 0,
                "text": self.tokenizer.decode(token_ids),
                "token_ids": token_ids,
                "prompt_token_ids": list(prompt),
                "logprobs": {"tokens": [self.tokenizer.decode([t]) for t in token_ids],
                             "token_logprobs": logprobs},
                "finish_reason": "stop",
            }
            return JSONResponse({"id": f"cmpl-{len(self.calls)}", "object": "text_completion",
                                 "model": body.get("model"), "choices": [choice],
                                 "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(token_ids)}})

        return Starlette(routes=[Route("/health", health), Route("/v1/completions", completions, methods=["POST"])])
