"""One chat completion: messages -> prompt ids -> engine -> reply, filed on the episode's timeline."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from agenttune.components.engines.base import Generation, Guide, GuideError, InferenceEngine, SamplingParams
from agenttune.components.parsers.base import ReasoningParser, ToolParse, ToolParser
from agenttune.config.policies import BASE_ADAPTER
from agenttune.gateway.api_errors import GatewayError
from agenttune.gateway.channel import DEFAULT_AGENT, EpisodeChannel
from agenttune.gateway.guides import guide_for
from agenttune.gateway.madness import (
    NONSENSE,
    WRONG_TOOLCALL,
    leaked_special_token,
    repetition_loop,
    wrong_tool_calls,
)
from agenttune.gateway.policy_routing import PolicyRouter
from agenttune.gateway.protocol import ChatRequest, parse_chat_request
from agenttune.gateway.rendering import ChatRenderer
from agenttune.gateway.responses import ChatResult, ChunkWriter
from agenttune.gateway.streaming import DeltaStream
from agenttune.gateway.timeline import Prompt, Timeline
from agenttune.web.ids import random_id

# A prompt with more text than this is rendered and tokenized in a thread, so that the event loop
# keeps answering other calls (and /health) meanwhile; shorter ones are cheaper to do in place.
OFF_LOOP_CHARS = 64 * 1024


@dataclass
class _Decoded:
    token_ids: list[int]  # what the engine generated (the sample's truth)
    text_ids: list[int]  # the same without the final stop token
    text: str
    stop_token: int | None  # the final stop token, when the reply ended on one


class ChatCompletions:
    def __init__(self, engine: InferenceEngine, renderer: ChatRenderer, tool_parser: ToolParser,
                 reasoning_parser: ReasoningParser | None, *, max_model_len: int, madness_checks: list[str],
                 max_turns: int | None = None, router: PolicyRouter | None = None):
        self.engine = engine
        self.router = router  # several policies: the agent's adapter samples its calls
        self.renderer = renderer
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        self.max_model_len = max_model_len
        self.max_turns = max_turns
        self.checks = set(madness_checks)
        eos = renderer.tokenizer.eos_token_id
        self.stop_token_ids = (eos,) if eos is not None else ()
        self.stop_tokens = frozenset(self.stop_token_ids) | renderer.special_ids
        self.chat_mode = engine.wants_messages
        self._renderer_thread: ThreadPoolExecutor | None = None  # one: large prompts take turns

    async def __call__(self, channel: EpisodeChannel, agent: str, body: Any) -> ChatResult:
        return await self.answer(channel, agent, parse_chat_request(body))

    async def answer(self, channel: EpisodeChannel, agent: str, request: ChatRequest) -> ChatResult:
        """The whole reply, once generated."""
        timeline = channel.timeline(agent)
        timeline.in_flight += 1
        try:
            prompt, sampling = await self._prepare(channel, timeline, request)
            generation, server_prompt = await self._generate(channel, request, prompt, sampling)
            if server_prompt is not None:  # chat mode: the server rendered the prompt
                prompt = Prompt(server_prompt)
            exact = bool(generation.token_ids) and (server_prompt is not None or not self.chat_mode)
            return self._finish(channel, timeline, request, prompt, generation, exact, guided=sampling.guide is not None)
        finally:
            timeline.in_flight -= 1

    @property
    def streams(self) -> bool:
        """Whether replies can be streamed as they are generated (chat-mode engines answer whole)."""
        return not self.chat_mode

    async def stream(self, channel: EpisodeChannel, agent: str, request: ChatRequest) -> AsyncIterator[bytes]:
        """The reply as server-sent events, chunk by chunk as tokens are sampled.

        Refusals (bad request, turn limit, context overflow) are raised here, before the stream
        starts, so they get their status code; an engine failure later ends the stream with an
        error event. The finished reply is recorded exactly as `answer` records it.
        """
        timeline = channel.timeline(agent)
        timeline.in_flight += 1
        try:
            prompt, sampling = await self._prepare(channel, timeline, request)
        except BaseException:
            timeline.in_flight -= 1
            raise
        return self._events(channel, timeline, request, prompt, sampling)

    async def _events(self, channel: EpisodeChannel, timeline: Timeline, request: ChatRequest, prompt: Prompt,
                      sampling: SamplingParams) -> AsyncIterator[bytes]:
        chunks = ChunkWriter(request, random_id("chatcmpl-"), int(time.time()))
        deltas = DeltaStream(reasoning=None if sampling.guide else self.reasoning_parser,
                             tool_start=self.tool_parser.START if request.parses_tool_calls else None,
                             stops=request.stop, prompt_opens_thinking=self._opens_thinking(prompt))
        try:
            yield chunks.delta({"role": "assistant", "content": ""})
            token_ids: list[int] = []
            generation = None
            async for event in self._generate_stream(channel, prompt, sampling):
                if isinstance(event, Generation):
                    generation = event
                    break
                token_ids += event
                text_ids = token_ids[:-1] if token_ids[-1] in self.stop_tokens else token_ids
                for delta in deltas.push(self.renderer.decode(text_ids)):
                    yield chunks.delta(delta)
            if generation is None:  # the contract: a stream ends with its Generation
                raise self._engine_failure(channel, RuntimeError("the engine's stream ended without a Generation"))
            self._check_logprobs(channel, generation)
            result = self._finish(channel, timeline, request, prompt, generation, bool(generation.token_ids),
                                  guided=sampling.guide is not None, result_id=chunks.id, created=chunks.created)
            for delta in deltas.finish(result.message):
                yield chunks.delta(delta)
            if deltas.mismatch:
                channel.counters["stream_mismatch"] += 1
            yield chunks.ending(result)
        except GatewayError as error:
            yield chunks.error(error)
        finally:
            timeline.in_flight -= 1

    async def _generate_stream(self, channel: EpisodeChannel, prompt: Prompt,
                               sampling: SamplingParams) -> AsyncIterator[list[int] | Generation]:
        events = self.engine.generate_stream(prompt.ids, sampling, request_id=channel.episode_id)
        try:
            async for event in events:
                yield event
        except GuideError as error:
            raise self._guide_refusal(error) from error
        except Exception as error:
            raise self._engine_failure(channel, error) from error
        finally:
            await events.aclose()

    def _opens_thinking(self, prompt: Prompt) -> bool:
        """Whether the chat template opened the reply's `<think>` block in the prompt itself."""
        if self.reasoning_parser is None:
            return False
        tail = self.renderer.decode(prompt.ids[-4:]).rstrip("\n")
        return tail.endswith(self.reasoning_parser.OPEN)

    async def _prepare(self, channel: EpisodeChannel, timeline: Timeline,
                       request: ChatRequest) -> tuple[Prompt, SamplingParams]:
        self._check_turns(channel, timeline)
        sampling = self._sampling(channel, request, timeline.agent)
        timeline.policy = None if sampling.adapter in (None, BASE_ADAPTER) else sampling.adapter
        characters = self._check_text_fits(channel, request, sampling)
        if characters > OFF_LOOP_CHARS:
            if self._renderer_thread is None:
                self._renderer_thread = ThreadPoolExecutor(1, thread_name_prefix="agenttune-render")
            prompt = await asyncio.get_running_loop().run_in_executor(self._renderer_thread, timeline.prompt_for,
                                                                      request)
        else:
            prompt = timeline.prompt_for(request)
        self._check_fits(channel, prompt, sampling)
        return prompt, sampling

    def _sampling(self, channel: EpisodeChannel, request: ChatRequest, agent: str = DEFAULT_AGENT) -> SamplingParams:
        # The episode decides temperature/top_p/top_k (training samples from the policy it trains);
        # the request may ask for fewer tokens, for stop strings, and for a grammar (tool_choice,
        # response_format).
        base = channel.sampling
        max_tokens = min(request.max_tokens or base.max_tokens, base.max_tokens)
        guide = guide_for(request, self.tool_parser)
        if guide is not None and not self.engine.enforces_guides:
            channel.counters["guide_not_enforced"] += 1  # (the scripted test engine; docs/gateway.md)
            guide = None
        adapter = self.router.adapter_for(channel, agent, request.model) if self.router is not None else None
        return self._request_sampling(base, max_tokens, request.stop or base.stop, guide, adapter)

    @lru_cache(maxsize=1024)  # noqa: B019 - one handler per gateway; a few distinct settings per run
    def _request_sampling(self, base: SamplingParams, max_tokens: int, stop: tuple[str, ...],
                          guide: Guide | None, adapter: str | None = None) -> SamplingParams:
        return replace(base, max_tokens=max_tokens, stop=stop, stop_token_ids=base.stop_token_ids + self.stop_token_ids,
                       guide=guide, adapter=adapter)

    def _check_turns(self, channel: EpisodeChannel, timeline: Timeline) -> None:
        # Calls running now count: an agent that sends several at once cannot slip past the limit.
        if self.max_turns is None or timeline.calls + timeline.in_flight <= self.max_turns:
            return
        channel.turn_limit = True
        channel.counters["turn_limit"] = 1
        agent = "" if timeline.agent == DEFAULT_AGENT else f" (agent {timeline.agent!r})"
        raise GatewayError(
            400, f"This episode has used all {self.max_turns} model calls it may make{agent} (rollout.max_turns), "
                 "so it ends here: stop calling the model and return. Raise rollout.max_turns to allow more.",
            code="max_turns_exceeded")

    def _check_text_fits(self, channel: EpisodeChannel, request: ChatRequest, sampling: SamplingParams) -> int:
        """Refuse at once, before any rendering, messages whose text alone cannot fit the context: no token
        is longer than the vocabulary's longest, so N characters are at least N / that many tokens.
        Returns the number of characters."""
        characters = sum(len(message["content"]) for message in request.messages)
        per_token = self.renderer.max_token_chars
        least = -(-characters // per_token) if per_token else 0
        if least + sampling.max_tokens > self.max_model_len:
            self._overflow(channel, f"at least {least + sampling.max_tokens} tokens (the messages' {characters} "
                                    f"characters are at least {least} tokens, and {sampling.max_tokens} in the "
                                    "completion)")
        return characters

    def _check_fits(self, channel: EpisodeChannel, prompt: Prompt, sampling: SamplingParams) -> None:
        needed = len(prompt.ids) + sampling.max_tokens
        if needed > self.max_model_len:
            self._overflow(channel, f"{needed} tokens ({len(prompt.ids)} in the messages, {sampling.max_tokens} in "
                                    "the completion)")

    def _overflow(self, channel: EpisodeChannel, requested: str) -> None:
        channel.context_overflow = True
        channel.counters["context_overflow"] = 1
        raise GatewayError(
            400, f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                 f"{requested}. Please reduce the length of the messages or completion.",
            code="context_length_exceeded", param="messages")

    async def _generate(self, channel: EpisodeChannel, request: ChatRequest, prompt: Prompt,
                        sampling: SamplingParams) -> tuple[Generation, list[int] | None]:
        try:
            if self.chat_mode:
                generation, server_prompt = await self.engine.generate_chat(request.messages, request.tools, sampling)
            else:
                generation, server_prompt = await self.engine.generate(
                    prompt.ids, sampling, request_id=channel.episode_id), None
        except GuideError as error:  # the request's schema, not the engine, is at fault
            raise self._guide_refusal(error) from error
        except Exception as error:
            raise self._engine_failure(channel, error) from error
        self._check_logprobs(channel, generation)
        return generation, server_prompt

    @staticmethod
    def _guide_refusal(error: GuideError) -> GatewayError:
        return GatewayError(400, error.refusal(), param="response_format")

    @staticmethod
    def _engine_failure(channel: EpisodeChannel, error: Exception) -> GatewayError:
        channel.counters["engine_errors"] += 1
        channel.engine_failing = True
        return GatewayError(502, f"The inference engine failed: {type(error).__name__}: {error}", code="engine_error")

    def _check_logprobs(self, channel: EpisodeChannel, generation: Generation) -> None:
        """One finite logprob per generated token, or the call fails: a 0.0 would train as probability 1."""
        if not generation.token_ids:  # text only: the episode is not trainable anyway
            return
        if not self.engine.returns_logprobs:
            generation.logprobs = None  # the sample says so; the trainer recomputes them
            return
        problem = logprob_problem(generation.token_ids, generation.logprobs)
        if problem is None:
            return
        cause, detail = problem
        channel.counters["engine_errors"] += 1
        channel.counters[f"engine_output_rejected/{cause}"] += 1
        channel.engine_failing = True
        raise GatewayError(
            502, f"The inference engine returned {len(generation.token_ids)} tokens with {detail}, so they cannot be "
                 f"trained on. Engines must report the sampled tokens' logprobs ({type(self.engine).__name__} "
                 "declares returns_logprobs); an engine that cannot should declare returns_logprobs = False.",
            code="engine_error")

    def _finish(self, channel: EpisodeChannel, timeline: Timeline, request: ChatRequest, prompt: Prompt,
                generation: Generation, exact: bool, *, guided: bool = False, result_id: str | None = None,
                created: int | None = None) -> ChatResult:
        channel.engine_failing = False
        decoded = self._decode(channel, generation, exact)
        text = decoded.text
        if generation.finish_reason == "stop" and request.stop:
            text = _cut_at_stop(text, request.stop)
        reply, parsed = self._reply(request, text, guided, truncated=generation.finish_reason == "length")
        self._check_madness(channel, request, decoded.text_ids, parsed)
        timeline.record(request, prompt, decoded.token_ids, generation.logprobs if exact else None, reply,
                        exact=exact, stop_token=decoded.stop_token, extendable=exact and not self.chat_mode,
                        forced=generation.forced if exact else None,
                        versions=generation.versions if exact else None)
        if exact and generation.forced:
            channel.counters["forced_tokens"] += sum(generation.forced)
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
        return ChatResult(request, result_id or random_id("chatcmpl-"), created or int(time.time()), message,
                          "tool_calls" if calls and not parsed.errors else generation.finish_reason, len(prompt.ids),
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

    def _reply(self, request: ChatRequest, text: str, guided: bool = False, *,
                truncated: bool = False) -> tuple[dict[str, Any], ToolParse]:
        """The assistant message: reasoning, content and tool calls read out of the text.

        A guided reply follows its grammar from the first token: it has no reasoning block (a
        `</think>` inside a JSON string is just text).
        """
        reasoning, content = None, text
        if self.reasoning_parser is not None and not guided:
            reasoning, content = self.reasoning_parser.split(text)
        parsed = self.tool_parser.parse(content) if request.parses_tool_calls else ToolParse(content)
        if parsed.errors and truncated:
            parsed = self._complete_calls(content, parsed)
        reply: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        calls = parsed.calls if request.parallel_tool_calls else parsed.calls[:1]
        if calls:
            reply["tool_calls"] = calls
        if reasoning:
            reply["reasoning_content"] = reasoning
        return reply, parsed

    def _complete_calls(self, content: str, parsed: ToolParse) -> ToolParse:
        """A reply the token budget cut off inside a tool call keeps the calls it finished (the cut one
        is dropped, and still counted as a tool-call error); otherwise all of it stays text."""
        end = self.tool_parser.END
        finished = content.rfind(end) if end else -1
        if not end or finished < 0:
            return parsed
        complete = self.tool_parser.parse(content[:finished + len(end)])
        if complete.errors or not complete.calls:
            return parsed
        return ToolParse(complete.content, complete.calls, parsed.errors)

    def _check_madness(self, channel: EpisodeChannel, request: ChatRequest, text_ids: list[int],
                       parsed: ToolParse) -> None:
        if NONSENSE in self.checks:
            if leaked_special_token(text_ids, self.renderer.special_ids):
                channel.flag_madness(NONSENSE, "a special token leaked into the reply")
            elif repetition_loop(text_ids):
                channel.flag_madness(NONSENSE, "the reply repeats one pattern over and over")
        if WRONG_TOOLCALL in self.checks:
            marker = self.tool_parser.START or ""
            without_tools = not request.tools and bool(marker) and marker in parsed.content
            problems = wrong_tool_calls(parsed.calls, parsed.errors, request.tool_names, without_tools)
            channel.counters["tool_call_errors"] += len(problems)
            for problem in problems:
                channel.flag_madness(WRONG_TOOLCALL, problem)


def logprob_problem(token_ids: list[int], logprobs: list[float] | None) -> tuple[str, str] | None:
    """(cause, description) when the logprobs cannot be trained on; None when they can."""
    if logprobs is None:
        return "no_logprobs", "no logprobs"
    if len(logprobs) != len(token_ids):
        return "logprob_count", f"{len(logprobs)} logprobs"
    for position, value in enumerate(logprobs):
        if not isinstance(value, int | float) or not math.isfinite(value):
            return "non_finite_logprob", f"a logprob of {value!r} at position {position}"
        if value > 1e-3:  # log-probabilities are <= 0; allow rounding
            return "positive_logprob", f"a logprob of {value!r} (> 0) at position {position}"
    return None


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    cut = min((at for at in (text.find(stop) for stop in stops) if at >= 0), default=-1)
    return text[:cut] if cut >= 0 else text
