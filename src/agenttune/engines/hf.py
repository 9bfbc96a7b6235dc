"""`hf`: a transformers causal LM on CPU or GPU that batches concurrent requests.

Requests that arrive while a batch runs wait and form the next batch, so 64 concurrent episodes
share forward passes instead of running one by one. Each batch is left-padded and decoded step by
step with a KV cache; every row has its own temperature, top-p, top-k, stop tokens, stop strings and
budget, and leaves the batch (and returns to its caller) as soon as it finishes.

The engine can share an already-loaded model (the local backbone trains the same object in
process, so rollouts always see the current weights without a copy).

Logprobs are `log_softmax(logits / temperature)` of the sampled token — temperature-scaled,
before top-k/top-p filtering — which is what a trainer recomputes at the same temperature. Greedy
rows (temperature 0) report `log_softmax(logits)`.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.engine import FinishReason, Generation, InferenceEngine, SamplingParams
from agenttune.engines.stopping import StopStrings, stop_token_set


class HFOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field(default="auto", description="auto, cpu, cuda or cuda:N (ignored when a model is shared).")
    max_batch_size: int = Field(default=64, gt=0, description="Most requests decoded together in one batch.")
    batch_wait_ms: float = Field(
        default=2.0, ge=0,
        description="Before a batch starts, how long to wait for the next request to arrive: requests sent "
                    "together (a group of episodes starting at once) then share one batch instead of "
                    "the first one running alone. 0 starts at once.")
    max_batch_wait_ms: float = Field(default=50.0, ge=0, description="The longest a batch waits to fill up.")


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    stop_ids: frozenset[int]
    stop_strings: StopStrings
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class HFEngine(InferenceEngine):
    name: ClassVar[str] = "hf"
    Options: ClassVar[type[BaseModel]] = HFOptions

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 64, max_model_len: int | None = None,
                 batch_wait_ms: float = 2.0, max_batch_wait_ms: float = 50.0):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s, self.max_batch_wait_s = batch_wait_ms / 1000, max_batch_wait_ms / 1000
        self.max_model_len = max_model_len or getattr(model.config, "max_position_embeddings", None) or 1 << 30
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        self.eos_ids = stop_token_set((), eos, tokenizer.eos_token_id)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.batch_sizes: list[int] = []  # one entry per batch run: how well requests were batched
        self._pending: list[_Request] = []
        self._wakeup = asyncio.Event()  # replaced by one of the serving loop in _ensure_worker
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agenttune-hf-engine")

    @classmethod
    def from_config(cls, config: Any, options: HFOptions, tokenizer: Any, *, model: Any = None) -> HFEngine:
        if model is None:
            from agenttune.model_loading import load_model

            model = load_model(config.model, device=options.device)
        return cls(model, tokenizer, max_batch_size=options.max_batch_size, max_model_len=config.model.max_model_len,
                   batch_wait_ms=options.batch_wait_ms, max_batch_wait_ms=options.max_batch_wait_ms)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), sampling, loop.create_future(),
                           stop_token_set(sampling.stop_token_ids, list(self.eos_ids)),
                           StopStrings(self.tokenizer, sampling.stop))
        self._ensure_worker(loop)
        self._pending.append(request)
        self._wakeup.set()
        return await request.future

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._worker
            self._worker = None
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the batching loop (event-loop side) -----------------------------------------------------
    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._pending = []
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._work(), name="agenttune-hf-engine")

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self._gather()
            while self._pending:
                batch = [request for request in self._pending[: self.max_batch_size] if not request.future.done()]
                del self._pending[: self.max_batch_size]
                if not batch:
                    continue
                self.batch_sizes.append(len(batch))
                try:
                    await loop.run_in_executor(self._executor, self._run_batch, batch, loop)
                except Exception as error:  # a failed batch fails its requests, not the engine
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(error)

    async def _gather(self) -> None:
        """Wait while requests keep arriving (each within `batch_wait_s` of the last), up to a full batch.

        Episodes of a group start together, but each request reaches the engine only after its client
        and the gateway have handled it, one after another on the event loop; starting at the first
        one would decode it alone while the rest queue for the next batch.
        """
        if not self.batch_wait_s:
            return
        clock = asyncio.get_running_loop().time
        deadline = clock() + self.max_batch_wait_s
        seen = 0
        while seen < len(self._pending) < self.max_batch_size and clock() < deadline:
            seen = len(self._pending)
            await asyncio.sleep(self.batch_wait_s)

    # -- one batch (worker-thread side) -------------------------------------------------------------
    def _run_batch(self, batch: list[_Request], loop: asyncio.AbstractEventLoop) -> None:
        import torch

        with torch.inference_mode(), _eval_mode(self.model):
            last = self._decode(batch, loop)
        # The last rows are answered only after the model's mode is restored: their callers may
        # start training the shared model as soon as they hear back.
        for request, finish in last:
            loop.call_soon_threadsafe(_resolve, request, finish)

    def _decode(self, batch: list[_Request], loop: asyncio.AbstractEventLoop) -> list[tuple[_Request, FinishReason]]:
        """Decode until every row finished; answer rows as they finish, except the last ones (returned)."""
        import torch

        device = self.model.device
        logits, cache, attention, next_positions = self._prefill(batch, device)
        active = list(batch)
        generators = _generators(active, device)
        while True:
            tokens, logprobs = _sample(logits, [request.sampling for request in active], generators, active)
            keep, finished = [], []
            for row, (request, token, logprob) in enumerate(zip(active, tokens.tolist(), logprobs.tolist(),
                                                               strict=True)):
                request.token_ids.append(token)
                request.logprobs.append(logprob)
                finish = self._finish_reason(request)
                if finish is not None:
                    finished.append((request, finish))
                elif not request.future.done():  # done: the caller gave up (timeout, cancel)
                    keep.append(row)
            if not keep:
                return finished
            for request, finish in finished:
                loop.call_soon_threadsafe(_resolve, request, finish)
            if len(keep) < len(active):  # finished rows leave the batch and its KV cache
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attention, next_positions, tokens = attention[index], next_positions[index], tokens[index]
                active = [active[row] for row in keep]
            attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=1)
            logits = self._forward(tokens[:, None], attention, next_positions, cache)
            next_positions = next_positions + 1

    def _prefill(self, batch: list[_Request], device: Any) -> tuple[Any, Any, Any, Any]:
        """Run the left-padded prompts; returns (last logits, KV cache, attention mask, next positions)."""
        import torch
        from transformers import DynamicCache

        width = max(len(request.prompt_ids) for request in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            input_ids[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            attention[row, width - len(request.prompt_ids):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = self._forward(input_ids, attention, positions, cache)
        return logits, cache, attention, positions[:, -1:] + 1

    def _forward(self, input_ids: Any, attention: Any, positions: Any, cache: Any) -> Any:
        output = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                            past_key_values=cache, use_cache=True, logits_to_keep=1)
        return output.logits[:, -1, :].float()

    def _finish_reason(self, request: _Request) -> FinishReason | None:
        if request.token_ids[-1] in request.stop_ids or request.stop_strings.hit(request.token_ids):
            return "stop"
        if len(request.token_ids) >= request.sampling.max_tokens:
            return "length"
        if len(request.prompt_ids) + len(request.token_ids) >= self.max_model_len:
            return "length"
        return None


def _resolve(request: _Request, finish: FinishReason) -> None:
    if not request.future.done():
        request.future.set_result(Generation(request.token_ids, request.logprobs, finish))


@contextlib.contextmanager
def _eval_mode(model: Any):
    """Sample in eval mode (no dropout) even when a trainer left the shared model in train mode."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def _generators(requests: list[_Request], device: Any) -> dict[int, Any]:
    """A seeded generator per request that asked for a seed (keyed by id(request))."""
    import torch

    generators = {}
    for request in requests:
        if request.sampling.seed is not None:
            generators[id(request)] = torch.Generator(device=device).manual_seed(request.sampling.seed)
    return generators


def _sample(logits: Any, samplings: list[SamplingParams], generators: dict[int, Any],
            requests: list[_Request]) -> tuple[Any, Any]:
    """Per-row temperature / top-k / top-p sampling; returns (token ids, their logprobs)."""
    import torch

    device = logits.device
    temperature = torch.tensor([s.temperature for s in samplings], device=device, dtype=logits.dtype)
    greedy = temperature < 1e-5  # as vLLM: tinier temperatures would overflow the scaled logits
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    filtered = _top_p(_top_k(scaled, samplings), samplings)
    probs = torch.softmax(filtered, dim=-1)
    sampled = torch.multinomial(probs, 1).squeeze(1)
    for row, request in enumerate(requests):
        generator = generators.get(id(request))
        if generator is not None and not greedy[row]:
            sampled[row] = torch.multinomial(probs[row], 1, generator=generator)[0]
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


def _top_k(scores: Any, samplings: list[SamplingParams]) -> Any:
    import torch

    vocab = scores.shape[-1]
    ks = [s.top_k if 0 < s.top_k < vocab else 0 for s in samplings]
    if not any(ks):
        return scores
    k = torch.tensor(ks, device=scores.device)
    kth = torch.topk(scores, max(ks), dim=-1).values.gather(1, (k.clamp(min=1) - 1)[:, None])
    return scores.masked_fill((k[:, None] > 0) & (scores < kth), float("-inf"))


def _top_p(scores: Any, samplings: list[SamplingParams]) -> Any:
    import torch

    if all(s.top_p >= 1.0 for s in samplings):
        return scores
    top_p = torch.tensor([s.top_p for s in samplings], device=scores.device, dtype=scores.dtype)
    ordered, order = torch.sort(scores, dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    outside = (probs.cumsum(dim=-1) - probs) > top_p[:, None]  # the most likely token always stays
    ordered = ordered.masked_fill(outside, float("-inf"))
    return torch.empty_like(scores).scatter_(1, order, ordered)
