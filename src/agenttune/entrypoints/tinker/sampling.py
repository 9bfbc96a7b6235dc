"""Sampling sessions and the sampling itself: from the base model or a saved sampler checkpoint.

A sampling session names its weights once (`create_sampling_session`, or the snapshot that
`save_weights_and_get_sampling_client` saves); a checkpoint's adapter is loaded on first use and kept.
Sampling is plain autoregressive decoding with the KV cache, all `num_samples` sequences in one batch.
Log-probs are the model's own (temperature 1), the same the trainer computes for the sampled tokens,
so an importance ratio starts at 1.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from agenttune.entrypoints.tinker.checkpoints import CheckpointStore
from agenttune.entrypoints.tinker.futures import TinkerError
from agenttune.entrypoints.tinker.models import ModelHost
from agenttune.entrypoints.tinker.protobuf import SampledSequence

DEFAULT_MAX_TOKENS = 128  # when the request sets none (Tinker's SamplingParams.max_tokens is optional)
LOADED_CHECKPOINTS = 4  # sampler adapters kept loaded; an RL loop saves one a step, so older ones are dropped


@dataclass(frozen=True)
class SamplingSession:
    session_id: str
    model_path: str | None  # a tinker:// sampler (or training) checkpoint; None: the base model


@dataclass(frozen=True)
class Sampled:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float] | None


class Sampler:
    def __init__(self, host: ModelHost, store: CheckpointStore):
        self.host, self.store = host, store
        self.sessions: dict[str, SamplingSession] = {}
        self._adapters: OrderedDict[str, str] = OrderedDict()  # checkpoint -> adapter name, oldest use first

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

    def sample(self, session_id: str, prompt: list[int], num_samples: int, params: dict[str, Any],
               *, prompt_logprobs: bool) -> Sampled:
        import torch

        session = self.session(session_id)
        if not prompt:
            raise TinkerError("The prompt is empty.")
        if not 1 <= num_samples <= 256:
            raise TinkerError("num_samples must be between 1 and 256.")
        vocab = self.host.model.config.vocab_size
        if max(prompt) >= vocab or min(prompt) < 0:
            raise TinkerError(f"A prompt token id is outside this model's vocabulary (0..{vocab - 1}).")
        adapter = self._adapter(session.model_path)
        with self.host.using(adapter) as model, torch.no_grad():
            return _generate(model, self.host.tokenizer, prompt, num_samples, params, prompt_logprobs,
                             self.host.context_length())

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


def _generate(model: Any, tokenizer: Any, prompt: list[int], num_samples: int, params: dict[str, Any],
              want_prompt_logprobs: bool, context: int | None) -> Sampled:
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS
    if context is not None:
        max_tokens = min(max_tokens, max(0, context - len(prompt)))
    stop_tokens, stop_strings = _stops(params.get("stop"), tokenizer)
    generator = torch.Generator(device=device)
    if params.get("seed") is not None:
        generator.manual_seed(int(params["seed"]))
    else:
        generator.seed()

    ids = torch.tensor([prompt] * num_samples, device=device)
    cache = {_cache_keyword(model): DynamicCache(config=model.config)}  # filled in place, call after call
    out = model(input_ids=ids, use_cache=True, **cache)
    prompt_logprobs = None
    if want_prompt_logprobs:
        first = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
        scored = first.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()
        prompt_logprobs = [float("nan"), *scored]
    sequences = [SampledSequence([], [], False) for _ in range(num_samples)]
    done = [False] * num_samples
    logits = out.logits[:, -1].float()
    for _ in range(max_tokens):
        token, logprob = _draw(logits, params, generator)
        for row, sequence in enumerate(sequences):
            if done[row]:
                continue
            sequence.tokens.append(int(token[row]))
            sequence.logprobs.append(float(logprob[row]))
            if _stopped(sequence.tokens, stop_tokens, stop_strings, tokenizer):
                sequence.stopped = done[row] = True
        if all(done):
            break
        logits = model(input_ids=token.unsqueeze(-1), use_cache=True, **cache).logits[:, -1].float()
    return Sampled(sequences, prompt_logprobs)


def _cache_keyword(model: Any) -> str:
    """transformers 5 calls the KV cache `cache` (the old `past_key_values` warns on every call), 4.x
    knows only the old name; as components/engines/transformers_decoder.py picks it."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _draw(logits: Any, params: dict[str, Any], generator: Any) -> tuple[Any, Any]:
    """One token per row, from the logits shaped by temperature, top_k and top_p; with its log-prob
    under the model itself (temperature 1)."""
    import torch

    logprobs = torch.log_softmax(logits, dim=-1)
    temperature = float(params.get("temperature", 1.0))
    if temperature <= 0:
        token = logits.argmax(-1)
    else:
        shaped = logits / temperature
        top_k = int(params.get("top_k", -1))
        if 0 < top_k < shaped.shape[-1]:
            kth = torch.topk(shaped, top_k, dim=-1).values[:, -1:]
            shaped = shaped.masked_fill(shaped < kth, float("-inf"))
        top_p = float(params.get("top_p", 1.0))
        if top_p < 1.0:
            ordered, order = torch.sort(shaped, descending=True, dim=-1)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
            cut = cumulative - torch.softmax(ordered, dim=-1) >= top_p  # keep the token that crosses top_p
            shaped = shaped.scatter(-1, order, ordered.masked_fill(cut, float("-inf")))
        probs = torch.softmax(shaped, dim=-1)
        token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return token, logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1)


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


def _stopped(tokens: list[int], stop_tokens: set[int], stop_strings: list[str], tokenizer: Any) -> bool:
    if tokens[-1] in stop_tokens:
        return True
    if stop_strings:
        tail = tokenizer.decode(tokens[-32:])  # checked after every token: a stop string ends its tail
        return any(stop in tail for stop in stop_strings)
    return False
