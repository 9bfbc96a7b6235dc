"""`scripted`: replays chosen replies. A test tool for exact checks of parsing, masks and merges.

Each reply is text (tokenized, then the end-of-turn token), a list of token ids (used as they are)
or a ready `Generation`. A `responder(prompt_ids, sampling)` callable may choose replies instead.
Logprobs are a fixed function of the token id (`scripted_logprob`), so tests can check alignment.
Every prompt it is given is kept in `prompts`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.components.engines.base import Generation, InferenceEngine, SamplingParams
from agenttune.components.engines.stopping import StopStrings

Reply = str | list[int] | Generation


def scripted_logprob(token_id: int) -> float:
    return -((token_id % 97) + 1) / 100


class ScriptedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replies: list[str] = Field(default_factory=list, description="Replies (text) to return, in order.")
    cycle: bool = Field(default=True, description="Start again from the first reply when all were used.")
    delay: float = Field(default=0.0, ge=0, description="Seconds each reply takes (to test timeouts).")


class ScriptedEngine(InferenceEngine):
    name: ClassVar[str] = "scripted"
    Options: ClassVar[type[BaseModel]] = ScriptedOptions

    def __init__(self, replies: Iterable[Reply] = (), *, tokenizer: Any = None,
                 responder: Callable[[list[int], SamplingParams], Reply] | None = None,
                 cycle: bool = False, delay: float = 0.0):
        self.replies = list(replies)
        self.tokenizer = tokenizer
        self.responder = responder
        self.cycle = cycle
        self.delay = delay
        self._eos = tokenizer.eos_token_id if tokenizer is not None else None
        self.prompts: list[list[int]] = []
        self.samplings: list[SamplingParams] = []
        self._next = 0

    @classmethod
    def from_config(cls, config: Any, options: ScriptedOptions, tokenizer: Any, *, model: Any = None) -> ScriptedEngine:
        return cls(options.replies, tokenizer=tokenizer, cycle=options.cycle, delay=options.delay)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        self.prompts.append(list(prompt_ids))
        self.samplings.append(sampling)
        if self.delay:
            await asyncio.sleep(self.delay)
        reply = self.responder(prompt_ids, sampling) if self.responder else self._take()
        if isinstance(reply, Generation):
            return reply
        if isinstance(reply, str):
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        else:
            ids = list(reply)
        return self._finish(ids, sampling)

    async def generate_stream(self, prompt_ids: list[int], sampling: SamplingParams, *,
                              request_id: str | None = None) -> AsyncGenerator[list[int] | Generation, None]:
        """The scripted reply one token at a time (so streaming is tested token by token), then whole."""
        generation = await self.generate(prompt_ids, sampling, request_id=request_id)
        for token in generation.token_ids:
            yield [token]
            await asyncio.sleep(0)
        yield generation

    def _take(self) -> Reply:
        if self._next >= len(self.replies):
            if not (self.cycle and self.replies):
                raise RuntimeError(f"the scripted engine has no reply left (it had {len(self.replies)})")
            self._next = 0
        reply = self.replies[self._next]
        self._next += 1
        return reply

    def _finish(self, ids: list[int], sampling: SamplingParams) -> Generation:
        """Apply what a real engine would: stop tokens, stop strings, the token budget."""
        stop_ids = set(sampling.stop_token_ids)
        if self._eos is not None:
            stop_ids.add(self._eos)
        stop_strings = StopStrings(self.tokenizer, sampling.stop) if self.tokenizer is not None and sampling.stop else None
        end = next((at + 1 for at, token in enumerate(ids) if token in stop_ids), len(ids))
        if stop_strings:
            end = next((at for at in range(1, end + 1) if stop_strings.hit(ids[:at])), end)
        kept = ids[: min(end, sampling.max_tokens)]
        stopped = len(kept) == end and (end < len(ids) or len(kept) < sampling.max_tokens or kept[-1] in stop_ids)
        return Generation(kept, [scripted_logprob(token) for token in kept], "stop" if stopped else "length")
