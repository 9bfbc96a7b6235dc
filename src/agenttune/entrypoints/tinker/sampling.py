"""Sampling sessions and the sampling itself: from the base model or a saved sampler checkpoint.

A sampling session names its weights once (`create_sampling_session`, or the snapshot that
`save_weights_and_get_sampling_client` saves); a checkpoint's adapter is loaded on first use and kept.

Sampling runs through agenttune's own `hf` inference engine (components/engines/hf.py), built on the
server's model the first time anything is sampled: each of a request's `num_samples` sequences is
one engine request, so concurrent sample requests share the engine's continuous batch (one forward
pass per step for all of them, identical prompts prefilled once). The engine computes whatever the
peft model computes now, and which adapter is active is global, so requests are scheduled in
groups by their weights (`Sampler._admitted`): the requests for one checkpoint (or the base model)
decode together; a request for other weights waits until the group decoding now has finished and
its adapter is made active, and groups start in the order their first request arrived. While a
group decodes, further requests for the same weights join it at once, unless requests for other
weights or training requests are waiting (they would starve otherwise).

A group holds the futures' worker thread (futures.py) from the moment its adapter is made active
until its last request is answered: training requests (forward_backward, optim_step, saves, loads)
queued meanwhile run after it, and a group waits for the training requests queued before it. So
nothing changes the model, or which adapter is active, while the engine decodes with it.

What the engine is asked, per sequence: the request's temperature, top-k, top-p and max_tokens
(capped by the context length); Tinker's `stop` as the engine's stop tokens or stop strings (`None`:
the tokenizer's end-of-sequence token; `[]`: none — the engine adds no end-of-sequence ids of its own
here); a seed, when given, derived per sequence from the request's (`_sequence_seed`: the same seed
gives the same sequences, alone or in any batch, and a request's sequences differ). Log-probs are
the model's own (temperature 1), the same the trainer computes for the sampled tokens, so an
importance ratio starts at 1: the engine reports temperature-scaled ones, so `_Engine` replaces
them with the unscaled ones in the steps where a row samples at another temperature. Prompt
log-probs (the first None) are the engine's `prompt_logprobs`, one forward pass on its decode thread.
Every request goes through the engine (it gives prompt log-probs and seeds as this API needs them);
the engine runs without CUDA graphs here (`build_engine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agenttune.components.engines.hf import HFEngine, HFOptions
from agenttune.components.engines.sampling import GREEDY_BELOW
from agenttune.entrypoints.tinker.checkpoints import CheckpointStore
from agenttune.entrypoints.tinker.futures import Futures, TinkerError
from agenttune.entrypoints.tinker.models import ModelHost
from agenttune.entrypoints.tinker.protobuf import SampledSequence

DEFAULT_MAX_TOKENS = 128  # when the request sets none (Tinker's SamplingParams.max_tokens is optional)
LOADED_CHECKPOINTS = 4  # sampler adapters kept loaded; an RL loop saves one a step, so older ones are dropped
SEED_STRIDE = 0x9E3779B97F4A7C15  # sequence i of a seeded request draws with seed + i * this (mod 2**63)


@dataclass(frozen=True)
class SamplingSession:
    session_id: str
    model_path: str | None  # a tinker:// sampler (or training) checkpoint; None: the base model


@dataclass(frozen=True)
class Sampled:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float] | None


@dataclass(eq=False)
class _Group:
    """Requests for one set of weights, decoded together while their adapter is active."""

    model_path: str | None
    ready: asyncio.Future[Any]  # the engine, once the adapter is active (or the error that prevented it)
    release: threading.Event = field(default_factory=threading.Event)  # set: the worker thread lets go
    requests: int = 0  # admitted and not yet answered


class Sampler:
    def __init__(self, host: ModelHost, store: CheckpointStore, futures: Futures):
        self.host, self.store, self.futures = host, store, futures
        self.sessions: dict[str, SamplingSession] = {}
        self._adapters: OrderedDict[str, str] = OrderedDict()  # checkpoint -> adapter name, oldest use first
        self.engine: Any = None  # the hf engine, built with the first group
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop that samples (the engine's), once known
        self._current: _Group | None = None  # the group holding the model now
        self._queued: OrderedDict[str | None, _Group] = OrderedDict()  # groups waiting, first arrival first
        futures.before_close(self.close)

    def open(self, model_path: str | None) -> SamplingSession:
        if model_path is not None:
            self.store.find(model_path)  # refuse a path with nothing behind it now, not at the first sample
        session = SamplingSession(f"sampler-{uuid.uuid4().hex}", model_path)
        self.sessions[session.session_id] = session
        return session

    def session(self, session_id: str) -> SamplingSession:
        session = self.sessions.get(session_id)
        if session is None:
            raise TinkerError(f"No sampling session {session_id!r} on this server (sessions end with the server).",
                              404)
        return session

    async def sample(self, session_id: str, prompt: list[int], num_samples: int, params: dict[str, Any],
                     *, prompt_logprobs: bool) -> Sampled:
        """Sample on the event loop that serves the requests (the engine batches the calls of one loop)."""
        session = self.session(session_id)
        if not prompt:
            raise TinkerError("The prompt is empty.")
        if not 1 <= num_samples <= 256:
            raise TinkerError("num_samples must be between 1 and 256.")
        vocab = self.host.model.config.vocab_size
        if max(prompt) >= vocab or min(prompt) < 0:
            raise TinkerError(f"A prompt token id is outside this model's vocabulary (0..{vocab - 1}).")
        self.loop = asyncio.get_running_loop()
        async with self._admitted(session.model_path) as engine:
            return await _generate(engine, self.host.tokenizer, prompt, num_samples, params, prompt_logprobs,
                                   self.host.context_length())

    def close(self) -> None:
        """Let the worker thread go (the server stops)."""
        for group in [self._current, *self._queued.values()]:
            if group is not None:
                group.release.set()

    # -- scheduling: one set of weights at a time -------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _admitted(self, model_path: str | None) -> AsyncIterator[Any]:
        """The engine, while `model_path`'s adapter is active and the model is the sampler's."""
        current = self._current
        if current is not None and current.model_path == model_path and not self._queued \
                and not self.futures.waiting():
            group = current  # joins the group decoding now (nothing else waits for the model)
        else:
            group = self._queued.get(model_path) or self._queue(model_path)
        group.requests += 1
        try:
            self._start_next()
            yield await asyncio.shield(group.ready)
        finally:
            self._leave(group)

    def _queue(self, model_path: str | None) -> _Group:
        group = _Group(model_path, asyncio.get_running_loop().create_future())
        self._queued[model_path] = group
        return group

    def _start_next(self) -> None:
        if self._current is not None or not self._queued:
            return
        _, group = self._queued.popitem(last=False)
        self._current = group
        loop = asyncio.get_running_loop()

        def hold() -> None:  # on the worker thread: after the requests queued before it, before those after
            try:
                adapter = self._adapter(group.model_path)
                with self.host.using(adapter):
                    engine = self._engine()
                    loop.call_soon_threadsafe(_settle, group.ready, engine, None)
                    group.release.wait()
            except BaseException as error:  # noqa: BLE001 - the group's requests fail with it
                loop.call_soon_threadsafe(_settle, group.ready, None, error)
                raise

        held = self.futures.run_on_worker(hold)
        held.add_done_callback(lambda done: done.cancelled() or done.exception())  # (reported through ready)

    def _leave(self, group: _Group) -> None:
        group.requests -= 1
        if group.requests:
            return
        if group is self._current:
            group.release.set()
            self._current = None
            self._start_next()
        elif self._queued.get(group.model_path) is group:  # every request of a queued group gave up
            del self._queued[group.model_path]
            group.ready.cancel()

    def _engine(self) -> Any:
        if self.engine is None:
            self.engine = build_engine(self.host)
        return self.engine

    def _adapter(self, model_path: str | None) -> str | None:
        if model_path is None:
            return None
        checkpoint = self.store.find(model_path)
        metadata = checkpoint.metadata()
        key = f"{model_path}@{metadata.get('saved_at')}"  # a checkpoint saved again under its name is new
        if key in self._adapters:
            self._adapters.move_to_end(key)
            return self._adapters[key]
        if metadata.get("base_model") != self.host.name:
            raise TinkerError(f"{model_path} was trained on another base model than {self.host.name!r}.")
        while len(self._adapters) >= LOADED_CHECKPOINTS:  # (reloaded from disk if asked for again)
            self.host.remove_adapter(self._adapters.popitem(last=False)[1])
        self._adapters[key] = self.host.load_adapter(checkpoint.directory, prefix="sampler")
        return self._adapters[key]



async def _generate(engine: Any, tokenizer: Any, prompt: list[int], num_samples: int, params: dict[str, Any],
                    want_prompt_logprobs: bool, context: int | None) -> Sampled:
    from agenttune.components.engines.base import SamplingParams

    max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS
    if context is not None:
        max_tokens = min(max_tokens, max(0, context - len(prompt)))
    prompt_logprobs = None
    if want_prompt_logprobs:
        prompt_logprobs = [float("nan"), *await engine.prompt_logprobs(prompt)]
    if max_tokens == 0:  # the prompt fills the context: nothing to sample
        return Sampled([SampledSequence([], [], False) for _ in range(num_samples)], prompt_logprobs)
    stop_tokens, stop_strings = _stops(params.get("stop"), tokenizer)
    seed = params.get("seed")
    samplings = [SamplingParams(temperature=float(params.get("temperature", 1.0)),
                                top_p=float(params.get("top_p", 1.0)), top_k=int(params.get("top_k", -1)),
                                max_tokens=int(max_tokens), stop=tuple(stop_strings),
                                stop_token_ids=tuple(sorted(stop_tokens)),
                                seed=None if seed is None else _sequence_seed(int(seed), index))
                 for index in range(num_samples)]
    generations = await asyncio.gather(*[engine.generate(prompt, sampling) for sampling in samplings])
    sequences = [SampledSequence(list(generation.token_ids), [float(value) for value in generation.logprobs or []],
                                 generation.finish_reason == "stop") for generation in generations]
    return Sampled(sequences, prompt_logprobs)


def _sequence_seed(seed: int, index: int) -> int:
    """Sequence `index`'s seed: the request's for the first, spread far apart for the others."""
    return (seed + index * SEED_STRIDE) % (1 << 63)


def build_engine(host: ModelHost) -> Any:
    """The `hf` engine on the server's model, as `agenttune serve` builds it (the engine section's
    defaults, but no CUDA graphs), computing whatever adapter is active."""
    options = HFOptions()
    # No CUDA graphs: a graph replays the kernels of the adapter that was active when it was captured
    # (peft picks the active adapters in Python), and the active adapter changes between groups.
    engine = _Engine(host.model, host.tokenizer, max_batch_size=options.max_batch_size,
                     max_model_len=host.context_length(), batch_wait_ms=options.batch_wait_ms,
                     max_batch_wait_ms=options.max_batch_wait_ms, lean_forward=options.lean_forward,
                     cuda_graphs=False)
    # Tinker's `stop` says every stop token itself (None: end-of-sequence; []: none), so the engine
    # adds none of its own.
    engine.eos_ids = frozenset()
    return engine


class _Engine(HFEngine):
    """`hf`, reporting the model's own log-probs (temperature 1) whatever the temperature it samples
    with: Tinker's sampled log-probs are those the trainer computes."""

    @staticmethod
    def _sampler(rows: list[Any], logits: Any) -> Any:
        sampler = HFEngine._sampler(rows, logits)
        scaled = any(request.sampling.temperature >= GREEDY_BELOW and request.sampling.temperature != 1.0
                     for request in rows)
        return _ModelLogprobs(sampler) if scaled else sampler


class _ModelLogprobs:
    """A batch sampler whose log-probs are `log_softmax(logits)` (greedy rows report those already)."""

    def __init__(self, sampler: Any):
        self.sampler = sampler

    def sample(self, logits: Any) -> tuple[Any, Any]:
        import torch

        tokens, _ = self.sampler.sample(logits)
        return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _stops(stop: Any, tokenizer: Any) -> tuple[set[int], list[str]]:
    """`stop`: None (the end-of-sequence token), [] (nothing), a string or strings, or token ids."""
    if stop is None:
        eos = tokenizer.eos_token_id
        return ({eos} if eos is not None else set()), []
    if isinstance(stop, str):
        return set(), [stop]
    if all(isinstance(item, int) for item in stop):
        return set(stop), []
    return set(), [str(item) for item in stop]
