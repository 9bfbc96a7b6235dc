"""One chat completion: messages -> prompt ids -> engine -> reply, filed on the episode's timeline."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from agenttune.engine import Generation, InferenceEngine, SamplingParams
from agenttune.gateway import madness
from agenttune.gateway.channel import EpisodeChannel
from agenttune.gateway.errors import GatewayError
from agenttune.gateway.ids import random_id
from agenttune.gateway.protocol import ChatRequest, parse_chat_request
from agenttune.gateway.reasoning import ThinkParser
from agenttune.gateway.rendering import ChatRenderer
from agenttune.gateway.timeline import Prompt, Timeline
from agenttune.gateway.tool_parsers import ToolParse, ToolParser


@dataclass
class _Decoded:
    token_ids: list[int]  # what the engine generated (the sample's truth)
    text_ids: list[int]  # the same without the final stop token
    text: str
    stop_token: int | None  # the final stop token, when the reply ended on one


@dataclass
class ChatResult:
    """A finished call, ready to be written as a JSON body or as SSE chunks."""

    request: ChatRequest
    id: str
    created: int
    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    token_logprobs: list[tuple[str, float]] | None = None


class ChatCompletions:
    def __init__(self, engine: InferenceEngine, renderer: ChatRenderer, tool_parser: ToolParser,
                 reasoning_parser: ThinkParser | None, *, max_model_len: int, madness_checks: list[str]):
        self.engine = engine
        self.renderer = renderer
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self.max_model_len = max_model_len
        self.checks = set(madness_checks)
        eos = renderer.tokenizer.eos_token_id
        self.stop_token_ids = (eos,) if eos is not None else ()
        self.stop_tokens = frozenset(self.stop_token_ids) | renderer.special_ids
        self.chat_mode = bool(getattr(engine, "wants_messages", False))

    async def __call__(self, channel: EpisodeChannel, agent: str, body: Any) -> ChatResult:
        request = parse_chat_request(body)
        timeline = channel.timeline(agent)
        timeline.in_flight += 1
        try:
            prompt = timeline.prompt_for(request)
            sampling = self._sampling(channel.sampling, request)
            self._check_fits(channel, prompt, sampling)
            generation, server_prompt = await self._generate(channel, request, prompt, sampling)
            if server_prompt is not None:  # chat mode: the server rendered the prompt
                prompt = Prompt(server_prompt)
            exact = bool(generation.token_ids) and (server_prompt is not None or not self.chat_mode)
            return self._finish(channel, timeline, request, prompt, generation, exact)
        finally:
            timeline.in_flight -= 1

    def _sampling(self, base: SamplingParams, request: ChatRequest) -> SamplingParams:
        # The episode decides temperature/top_p/top_k (training samples from the policy it trains);
        # the request may ask for fewer tokens and for stop strings.
        max_tokens = min(request.max_tokens or base.max_tokens, base.max_tokens)
        return self._request_sampling(base, max_tokens, request.stop or base.stop)

    @lru_cache(maxsize=1024)  # noqa: B019 - one handler per gateway; a few distinct settings per run
    def _request_sampling(self, base: SamplingParams, max_tokens: int, stop: tuple[str, ...]) -> SamplingParams:
        return replace(base, max_tokens=max_tokens, stop=stop, stop_token_ids=base.stop_token_ids + self.stop_token_ids)

    def _check_fits(self, channel: EpisodeChannel, prompt: Prompt, sampling: SamplingParams) -> None:
        needed = len(prompt.ids) + sampling.max_tokens
        if needed > self.max_model_len:
            channel.context_overflow = True
            channel.counters["context_overflow"] = 1
            raise GatewayError(
                400, f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                     f"{needed} tokens ({len(prompt.ids)} in the messages, {sampling.max_tokens} in the completion). "
                     "Please reduce the length of the messages or completion.",
                code="context_length_exceeded", param="messages")

    async def _generate(self, channel: EpisodeChannel, request: ChatRequest, prompt: Prompt,
                        sampling: SamplingParams) -> tuple[Generation, list[int] | None]:
        try:
            if self.chat_mode:
                return await self.engine.generate_chat(request.messages, request.tools, sampling)
            return await self.engine.generate(prompt.ids, sampling, request_id=channel.episode_id), None
        except Exception as error:
            channel.counters["engine_errors"] += 1
            channel.engine_failing = True
            raise GatewayError(502, f"The inference engine failed: {type(error).__name__}: {error}",
                               code="engine_error") from error

    def _finish(self, channel: EpisodeChannel, timeline: Timeline, request: ChatRequest, prompt: Prompt,
                generation: Generation, exact: bool) -> ChatResult:
        channel.engine_failing = False
        decoded = self._decode(channel, generation, exact)
        text = decoded.text
        if generation.finish_reason == "stop" and request.stop:
            text = _cut_at_stop(text, request.stop)
        reply, parsed = self._reply(request, text)
        self._check_madness(channel, request, decoded.text_ids, parsed)
        timeline.record(request, prompt, decoded.token_ids, generation.logprobs if exact else None, reply,
                        exact=exact, stop_token=decoded.stop_token, extendable=exact and not self.chat_mode)
        counters = channel.counters
        counters["calls"] += 1
        counters["prompt_tokens"] += len(prompt.ids)
        counters["generated_tokens"] += len(decoded.token_ids)
        counters["tool_calls"] += len(reply.get("tool_calls", ()))
        logprobs = None
        if request.logprobs and exact and generation.logprobs is not None:
            logprobs = [(self.renderer.token_text(token), logprob)
                        for token, logprob in zip(decoded.text_ids, generation.logprobs, strict=False)]
        calls = reply.get("tool_calls")
        message = {**reply, "content": reply["content"] if (reply["content"] or not calls) else None}
        return ChatResult(request, random_id("chatcmpl-"), int(time.time()), message,
                          "tool_calls" if calls else generation.finish_reason, len(prompt.ids),
                          len(decoded.token_ids), logprobs)

    def _decode(self, channel: EpisodeChannel, generation: Generation, exact: bool) -> _Decoded:
        if not exact:  # the engine gave text only: keep it for the log, the episode is not trainable
            channel.trainable = False
            token_ids = self.renderer.encode(generation.text or "")
            return _Decoded(token_ids, token_ids, generation.text or "", None)
        token_ids = generation.token_ids
        ends_on_stop = generation.finish_reason == "stop" and token_ids[-1] in self.stop_tokens
        text_ids = token_ids[:-1] if ends_on_stop else token_ids
        return _Decoded(token_ids, text_ids, self.renderer.decode(text_ids), token_ids[-1] if ends_on_stop else None)

    def _reply(self, request: ChatRequest, text: str) -> tuple[dict[str, Any], ToolParse]:
        """The assistant message: reasoning, content and tool calls read out of the text."""
        reasoning, content = self.reasoning_parser.split(text) if self.reasoning_parser else (None, text)
        parsed = self.tool_parser.parse(content) if request.parses_tool_calls else ToolParse(content)
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        calls = parsed.calls if request.parallel_tool_calls else parsed.calls[:1]
        if calls:
            reply["tool_calls"] = calls
        if reasoning:
            reply["reasoning_content"] = reasoning
        return reply, parsed

    def _check_madness(self, channel: EpisodeChannel, request: ChatRequest, text_ids: list[int],
                       parsed: ToolParse) -> None:
        if madness.NONSENSE in self.checks:
            if madness.leaked_special_token(text_ids, self.renderer.special_ids):
                channel.flag_madness(madness.NONSENSE, "a special token leaked into the reply")
            elif madness.repetition_loop(text_ids):
                channel.flag_madness(madness.NONSENSE, "the reply repeats one pattern over and over")
        if madness.WRONG_TOOLCALL in self.checks:
            marker: str = getattr(self.tool_parser, "START", "")
            without_tools = not request.tools and bool(marker) and marker in parsed.content
            problems = madness.wrong_tool_calls(parsed.calls, parsed.errors, request.tool_names, without_tools)
            channel.counters["tool_call_errors"] += len(problems)
            for problem in problems:
                channel.flag_madness(madness.WRONG_TOOLCALL, problem)


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    cut = min((at for at in (text.find(stop) for stop in stops) if at >= 0), default=-1)
    return text[:cut] if cut >= 0 else text
