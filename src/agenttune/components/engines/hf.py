"""`hf`: a transformers causal LM on CPU or GPU that batches concurrent requests.

Concurrent requests share forward passes: a batch is left-padded and decoded step by step with a
KV cache; every row has its own temperature, top-p, top-k, stop tokens, stop strings, guide and
budget, and leaves the batch (and returns to its caller) as soon as it finishes. Requests that
arrive while a batch decodes join it at the next step (continuous batching, up to `max_batch_size`
rows): their prompts are prefilled together and their KV cache is left-padded to the batch's and
appended — a multi-turn agent's second turn does not wait for the other episodes' first turns.
Leading columns that no row attends to any more (those of rows gone) are dropped from the cache.
A decode step is one forward pass, one batched sampling (`components/engines/sampling.py`: per-row settings
as tensors built when rows join or leave) and one device-to-host copy of the step's tokens and
logprobs; stop tokens and stop strings are then checked on the host, stop strings only for rows
that have them and only on the new text's tail. Identical prompts in a prefill are run once (a
GRPO group's episodes share theirs). Llama, qwen2, qwen3 and mistral models run the engine's own
forward pass (components/engines/lean_decoder.py), any other model transformers'.

The engine can share an already-loaded model (the local backbone trains the same object in
process, so rollouts always see the current weights without a copy). Asynchronous training gives it
a copy instead and calls `sync_weights` after each optimizer step: the copy happens between two
decode steps (a lock held around each forward pass), so requests in flight go on with the new
weights, and every token records the policy version that sampled it (`Generation.versions`).

Logprobs are `log_softmax(logits / temperature)` of the sampled token — temperature-scaled,
before top-k/top-p filtering — which is what a trainer recomputes at the same temperature. Greedy
rows (temperature 0) report `log_softmax(logits)`. Rows with a guide (tool_choice, response_format)
sample from the logits with the tokens their grammar forbids masked out (components/engines/grammar.py) and
report that masked distribution's logprob: the behaviour policy rollout correction must see.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.components.engines.adapter_rows import adapter_names, rows_with_adapters
from agenttune.components.engines.base import FinishReason, Generation, InferenceEngine, SamplingParams
from agenttune.components.engines.grammar import GrammarBook, advance
from agenttune.components.engines.sampling import BatchSampler, seeded_generator, to_host
from agenttune.components.engines.stopping import StopStrings, stop_token_set

MIN_TRIMMED_COLUMNS = 64  # dead columns a trim waits for, at least (`HFEngine._trim_padding`)


class HFOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field(default="auto", description="auto, cpu, cuda or cuda:N (ignored when a model is shared).")
    max_batch_size: int = Field(default=128, gt=0, description="Most requests decoded together in one batch (a cap: max_batch_tokens or kv_cache_memory_fraction size it below that).")
    max_batch_tokens: int | None = Field(
        default=None, gt=0,
        description="KV-cache budget in tokens: a request joins a batch only while rows x the longest row's "
                    "prompt + max_tokens fits (left-padded rows are as long as the longest). None: "
                    "kv_cache_memory_fraction decides on CUDA, max_batch_size alone elsewhere.")
    kv_cache_memory_fraction: float | None = Field(
        default=None, gt=0, le=1,
        description="On CUDA: the share of the GPU memory free when the engine starts that the KV cache may "
                    "use; it sets max_batch_tokens from the model's KV bytes per token. Ignored on CPU.")
    batch_wait_ms: float = Field(
        default=2.0, ge=0,
        description="Before a batch starts, how long to wait for the next request to arrive: requests sent "
                    "together (a group of episodes starting at once) then share one batch instead of "
                    "the first one running alone. 0 starts at once.")
    max_batch_wait_ms: float = Field(default=50.0, ge=0, description="The longest a batch waits to fill up.")
    lean_forward: bool = Field(
        default=True,
        description="Run llama, qwen2, qwen3 and mistral models through the engine's own forward pass "
                    "(components/engines/lean_decoder.py: the model's layers without transformers' per-call "
                    "bookkeeping, a preallocated KV cache). False, or any other model: the "
                    "transformers model's forward.")
    cuda_graphs: bool = Field(
        default=True,
        description="On CUDA, with the lean forward pass: record each decode step as a CUDA graph (one per "
                    "batch-size bucket) and replay it; the KV cache then lives in one fixed storage of "
                    "max_batch_size rows (components/engines/cuda_graphs.py). False: launch every kernel each step.")
    cpu_threads: int | None = Field(
        default=None, gt=0,
        description="On CPU: the intra-op threads of the decode thread. None: when the engine shares its "
                    "model with a trainer in the same process (the local backbone), half of torch's "
                    "(at least one): two thread teams that each want every core slow each other "
                    "down; otherwise torch's. Ignored on CUDA.")


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    stop_ids: frozenset[int]
    stop_strings: StopStrings
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    matcher: Any = None  # the guide's grammar state, for requests with a guide
    stream: asyncio.Queue | None = None  # streamed requests: each step's token, then the Generation or error
    forced: list[bool] = field(default_factory=list)  # per token, with a guide: the only token allowed
    versions: list[int] = field(default_factory=list)  # per token: the policy version that sampled it
    generator: Any = None  # a seeded request's torch.Generator on the model's device (its own draws)


class HFEngine(InferenceEngine):
    name: ClassVar[str] = "hf"
    Options: ClassVar[type[BaseModel]] = HFOptions
    enforces_guides: ClassVar[bool] = True
    updates_weights: ClassVar[bool] = True
    scores_prompts: ClassVar[bool] = True

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 128, max_batch_tokens: int | None = None,
                 max_model_len: int | None = None,
                 batch_wait_ms: float = 2.0, max_batch_wait_ms: float = 50.0, lean_forward: bool = True,
                 cuda_graphs: bool = True, cpu_threads: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.batch_wait_s, self.max_batch_wait_s = batch_wait_ms / 1000, max_batch_wait_ms / 1000
        self.max_model_len = max_model_len or getattr(model.config, "max_position_embeddings", None) or 1 << 30
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        self.eos_ids = stop_token_set((), eos, tokenizer.eos_token_id)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        # One entry per recent batch run (how well requests were batched); `counters()` counts them all.
        self.batch_sizes: deque[int] = deque(maxlen=1 << 16)
        self.joined = 0  # requests that joined a batch already decoding (continuous batching)
        self.prefilled_rows = 0  # prompts run through the model: identical prompts count once
        # One entry per recent decode step: (rows decoded, requests in flight = those rows + the ones
        # queued). Their ratio is the batch occupancy (bench/multiturn_rollout.py). `counters()` sums all.
        self.decode_steps: deque[tuple[int, int]] = deque(maxlen=1 << 16)
        self._totals: Counter[str] = Counter()
        # Wall and CPU seconds of the decode thread inside batches: CPU below wall is time it waited
        # (for the GIL the event loop held, or for a core) — bench/multiturn_rollout.py reports it.
        self.decode_wall_s = self.decode_cpu_s = 0.0
        self._grammars: GrammarBook | None = None
        self._pending: list[_Request] = []
        self._pending_lock = threading.Lock()  # appended on the event loop, taken by the decode thread
        self._wakeup = asyncio.Event()  # replaced by one of the serving loop in _ensure_worker
        self._worker: asyncio.Task | None = None
        self._executor = _decode_executor(model, cpu_threads)
        # The decode thread's intra-op threads on CPU (None: torch's, or not on CPU): a trainer in this
        # process leaves them to it (backbones/local/loop.py, asynchronous modes).
        self.cpu_threads = cpu_threads if model.device.type == "cpu" else None
        # Several adapters (policies): each row runs its own, which a recorded CUDA graph cannot follow.
        graphs = cuda_graphs and len(adapter_names(model)) < 2
        self._decoder = _decoder(model, lean_forward, cuda_graphs=graphs, max_rows=max_batch_size)
        self.policy_version = 0
        self._weights_lock = threading.Lock()  # held by each forward pass, and by a weight update

    @classmethod
    def from_config(cls, config: Any, options: HFOptions, tokenizer: Any, *, model: Any = None) -> HFEngine:
        shared = model is not None  # the trainer's: it computes in this process too
        if model is None:
            from agenttune.components.engines.model_loading import load_model

            model = load_model(config.model, device=options.device)
        threads = options.cpu_threads or (_half_the_threads() if shared else None)
        budget = options.max_batch_tokens or _kv_budget_tokens(model, options.kv_cache_memory_fraction)
        return cls(model, tokenizer, max_batch_size=options.max_batch_size, max_batch_tokens=budget,
                   max_model_len=config.model.max_model_len,
                   batch_wait_ms=options.batch_wait_ms, max_batch_wait_ms=options.max_batch_wait_ms,
                   lean_forward=options.lean_forward, cuda_graphs=options.cuda_graphs, cpu_threads=threads)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The model's LoRA adapters: a request's `SamplingParams.adapter` picks its row's."""
        return adapter_names(self.model)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        return await self._submit(prompt_ids, sampling).future

    async def generate_stream(self, prompt_ids: list[int], sampling: SamplingParams, *,
                              request_id: str | None = None) -> AsyncGenerator[list[int] | Generation, None]:
        """Every decode step's token as it is sampled, then the Generation."""
        request = self._submit(prompt_ids, sampling, stream=True)
        stream = request.stream
        assert stream is not None  # _submit(stream=True) gives it one
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                yield item if isinstance(item, Generation) else [item]
                if isinstance(item, Generation):
                    return
        finally:
            if not request.future.done():  # the caller left: the row leaves the batch at the next step
                request.future.cancel()

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """One forward pass on the decode thread (so it never overlaps a decode step or a weight update)."""
        if len(token_ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens, more than max_model_len ({self.max_model_len})")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._score, list(token_ids))

    def _score(self, token_ids: list[int]) -> list[float]:
        import torch

        if len(token_ids) < 2:
            return []
        with torch.inference_mode(), _eval_mode(self.model), self._weights_lock:
            ids = torch.tensor([token_ids], device=self.model.device)
            logits = self.model(input_ids=ids).logits[0, :-1].float()
            scored = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        return scored.tolist()

    def _submit(self, prompt_ids: list[int], sampling: SamplingParams, *, stream: bool = False) -> _Request:
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), sampling, loop.create_future(),
                           stop_token_set(sampling.stop_token_ids, list(self.eos_ids)),
                           StopStrings(self.tokenizer, sampling.stop), stream=asyncio.Queue() if stream else None,
                           generator=seeded_generator(sampling, self.model.device))
        if sampling.guide is not None:
            request.matcher = self.grammars.matcher(sampling.guide)
        self._ensure_worker(loop)
        with self._pending_lock:
            self._pending.append(request)
        self._wakeup.set()
        return request

    @property
    def grammars(self) -> GrammarBook:
        if self._grammars is None:
            vocab = max(self.model.config.vocab_size, len(self.tokenizer))
            self._grammars = GrammarBook(self.tokenizer, vocab, sorted(self.eos_ids))
        return self._grammars

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
                batch = self._take_pending([])  # (rows that join later are added to it)
                if not batch:
                    continue
                self.batch_sizes.append(len(batch))
                self._totals["batches"] += 1
                try:
                    await loop.run_in_executor(self._executor, self._run_batch, batch, loop)
                except Exception as error:  # a failed batch fails its requests, not the engine
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(error)
                            if request.stream is not None:
                                request.stream.put_nowait(error)

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

    def _take_pending(self, active: list[_Request]) -> list[_Request]:
        """The waiting requests that fit beside `active` (rows and KV-cache budget), by priority, then in
        arrival order; requests whose callers gave up are dropped. Called from either thread."""
        taken: list[_Request] = []
        longest = max((_reserved(request) for request in active), default=0)
        with self._pending_lock:
            self._pending.sort(key=_priority)  # stable: arrival order among equals
            while self._pending and len(active) + len(taken) < self.max_batch_size:
                request = self._pending[0]
                if request.future.done():
                    self._pending.pop(0)
                    continue
                wider = max(longest, _reserved(request))
                if self.max_batch_tokens and (active or taken) and \
                        (len(active) + len(taken) + 1) * wider > self.max_batch_tokens:
                    break  # it waits for rows to leave (a lone request always runs)
                longest = wider
                taken.append(self._pending.pop(0))
        return taken

    # -- one batch (worker-thread side) -------------------------------------------------------------
    def _run_batch(self, batch: list[_Request], loop: asyncio.AbstractEventLoop) -> None:
        import torch

        started, cpu_started = time.perf_counter(), time.thread_time()
        with torch.inference_mode(), _eval_mode(self.model):
            last = self._decode(batch, loop)
        self.decode_wall_s += time.perf_counter() - started
        self.decode_cpu_s += time.thread_time() - cpu_started
        # The last rows are answered only after the model's mode is restored: their callers may
        # start training the shared model as soon as they hear back.
        for request, finish in last:
            loop.call_soon_threadsafe(_resolve, request, finish)

    def _decode(self, batch: list[_Request], loop: asyncio.AbstractEventLoop) -> list[tuple[_Request, FinishReason]]:
        """Decode until every row finished; answer rows as they finish, except the last ones (returned).

        Continuous batching: after each step, requests that arrived meanwhile join (their prompts
        prefilled together, their KV cache left-padded to the batch's and appended), up to
        `max_batch_size` rows; a finished row leaves at once. Joined requests are added to `batch`.
        """
        import torch

        device = self.model.device
        with self._weights_lock:
            version = self.policy_version  # of the weights that computed `logits`
            logits, cache, attention, next_positions = self._prefill(batch, device)
        active = list(batch)
        sampler = self._sampler(active, logits)
        mask = _GrowingMask(attention)
        joinable = cache.joinable
        while True:
            self._count_step(len(active), len(active) + len(self._pending), mask.length + 1)
            matchers = [request.matcher for request in active]
            guided = any(matcher is not None for matcher in matchers)
            forced = self.grammars.mask(logits, matchers) if guided else None
            tokens, logprobs = sampler.sample(logits)
            token_list, logprob_list, forced_list = to_host(tokens, logprobs, forced)
            if guided:
                advance(matchers, token_list)
            keep, finished, streamed = [], [], []
            for row, (request, token, logprob) in enumerate(zip(active, token_list, logprob_list, strict=True)):
                request.token_ids.append(token)
                request.logprobs.append(logprob)
                request.versions.append(version)
                if request.matcher is not None:
                    request.forced.append(forced_list[row])
                if request.stream is not None:
                    streamed.append((request.stream, token))
                finish = self._finish_reason(request)
                if finish is not None:
                    finished.append((request, finish))
                elif not request.future.done():  # done: the caller gave up (timeout, cancel)
                    keep.append(row)
            if streamed:  # one hand-over to the event loop per step, for all streamed rows
                loop.call_soon_threadsafe(_deliver, streamed)
            if not keep:
                return finished
            for request, finish in finished:
                loop.call_soon_threadsafe(_resolve, request, finish)
            if len(keep) < len(active):  # finished rows leave the batch and its KV cache
                order = _filling_holes(keep)
                index = torch.tensor(order, device=device)
                cache.select(order, index)
                mask.select(index)
                if joinable:
                    self._trim_padding(cache, mask)
                next_positions, tokens = next_positions[index], tokens[index]
                active = [active[row] for row in order]
                sampler = self._sampler(active, logits)
            attention = mask.extend()
            with self._weights_lock:  # a weight update lands between steps, never inside one
                version = self.policy_version
                with rows_with_adapters(self.model, [request.sampling.adapter for request in active]):
                    logits = self._decoder.forward(tokens[:, None], attention, next_positions, cache)
                newcomers = self._take_pending(active) if joinable and self._pending else []
                if newcomers:
                    new_logits, new_cache, new_attention, new_positions = self._prefill(newcomers, device)
            next_positions = next_positions + 1
            if newcomers:
                cache.join(new_cache)
                mask = _GrowingMask(_joined_masks(attention, new_attention))
                logits, next_positions = torch.cat([logits, new_logits]), torch.cat([next_positions, new_positions])
                active += newcomers
                batch += newcomers
                sampler = self._sampler(active, logits)
                self.joined += len(newcomers)

    def _trim_padding(self, cache: Any, mask: _GrowingMask) -> None:
        """Drop the leading columns that are padding in every row, once they are a quarter of the cache.

        A continuous batch's columns only grow: a row joins left-padded to the batch's width, and the
        columns of rows long gone stay as every later row's padding, which each decode step still
        attends over (under steady traffic a batch never ends). On CPU a trim is a
        view; with CUDA graphs the next step copies the cache into the graphs' storage once
        (cuda_graphs.StaticKV.adopt), hence the threshold: a copy at most when a quarter is dead."""
        dead = mask.padding_columns()
        if dead >= max(MIN_TRIMMED_COLUMNS, mask.length // 4):
            cache.trim(dead)
            mask.trim(dead)
            self._totals["trimmed_columns"] += dead

    def _count_step(self, rows: int, in_flight: int, columns: int) -> None:
        self.decode_steps.append((rows, in_flight))
        self._totals["decode_steps"] += 1
        self._totals["rows_decoded"] += rows
        self._totals["rows_in_flight"] += in_flight
        self._totals["columns"] += columns  # the KV-cache width each row of the step attends over

    def counters(self) -> dict[str, float]:
        return {**self._totals, "decode_s": self.decode_wall_s, "decode_cpu_s": self.decode_cpu_s,
                "prefilled_rows": self.prefilled_rows, "joined": self.joined,
                "columns": self._totals["columns"], "trimmed_columns": self._totals["trimmed_columns"],
                "graph_steps": getattr(self._decoder, "graph_steps", 0),
                "graph_captures": getattr(self._decoder, "captures", 0)}

    @staticmethod
    def _sampler(rows: list[_Request], logits: Any) -> BatchSampler:
        """The rows' sampling settings as tensors: built when rows join or leave, not every step."""
        return BatchSampler.for_rows([request.sampling for request in rows], [request.generator for request in rows],
                                     vocab_size=logits.shape[-1], device=logits.device)

    def _prefill(self, batch: list[_Request], device: Any) -> tuple[Any, Any, Any, Any]:
        """Run the left-padded prompts; returns (last logits, KV cache, attention mask, next positions).

        Identical prompts are run once and their cache rows copied: a GRPO group's episodes start
        with the same prompt, so a group of 8 prefills one row instead of 8 (one per adapter, when the
        rows name several).
        """
        import torch

        first_row: dict[tuple[str | None, tuple[int, ...]], int] = {}
        rows = [first_row.setdefault((request.sampling.adapter, tuple(request.prompt_ids)), len(first_row))
                for request in batch]
        adapters = [adapter for adapter, _ in first_row]
        prompts = [prompt for _, prompt in first_row]
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention[row, width - len(prompt):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = self._decoder.new_cache()
        with rows_with_adapters(self.model, adapters):
            logits = self._decoder.forward(input_ids, attention, positions, cache)
        self.prefilled_rows += len(prompts)
        if len(prompts) < len(batch):  # copy the shared prompts' rows to every request that sent them
            index = torch.tensor(rows, device=device)
            cache.select(rows, index)
            logits, attention, positions = logits[index], attention[index], positions[index]
        return logits, cache, attention, positions[:, -1:] + 1

    @property
    def uses_lean_forward(self) -> bool:
        """Whether this engine runs its own forward pass (components/engines/lean_decoder.py) or transformers'."""
        return self._decoder.lean

    async def sync_weights(self, model: Any, version: int = 0) -> None:
        if model is self.model:  # the trained model itself (synchronous training): nothing to copy
            self.policy_version = version
            return
        # In a thread: the copy waits for the decode step in progress, the event loop must not.
        await asyncio.to_thread(self.update_weights, model, version)

    def update_weights(self, model: Any, version: int) -> None:
        """Copy `model`'s parameters and buffers into this engine's model (same architecture, same
        names) between two decode steps, then sample as policy `version`."""
        import torch

        with self._weights_lock, torch.no_grad():
            if model is not self.model:
                _copy_weights(model, self.model)
            self.policy_version = version

    def _finish_reason(self, request: _Request) -> FinishReason | None:
        if request.token_ids[-1] in request.stop_ids or request.stop_strings.hit(request.token_ids):
            return "stop"
        if len(request.token_ids) >= request.sampling.max_tokens:
            return "length"
        if len(request.prompt_ids) + len(request.token_ids) >= self.max_model_len:
            return "length"
        return None


def _copy_weights(source: Any, target: Any) -> None:
    targets = dict(target.named_parameters()) | dict(target.named_buffers())
    for name, tensor in [*source.named_parameters(), *source.named_buffers()]:
        destination = targets.get(name)
        if destination is None:
            raise ValueError(f"update_weights: the engine's model has no {name!r}: it is not a copy of the "
                             "trained model.")
        destination.copy_(tensor.detach(), non_blocking=True)


def _decoder(model: Any, lean_forward: bool, *, cuda_graphs: bool = False, max_rows: int = 1) -> Any:
    """The engine's own forward pass for this model (its decode steps as CUDA graphs on a GPU), or
    transformers' where the lean one cannot run."""
    import torch

    from agenttune.components.engines.cuda_graphs import GraphedDecoder
    from agenttune.components.engines.lean_decoder import LeanDecoder
    from agenttune.components.engines.transformers_decoder import TransformersDecoder
    from agenttune.config.run import get_logger

    if not lean_forward or not LeanDecoder.supports(model):
        return TransformersDecoder(model)
    try:
        decoder = LeanDecoder(model)
        with torch.inference_mode(), _eval_mode(model):
            if decoder.matches_transformers():
                graphs = cuda_graphs and model.device.type == "cuda"
                return GraphedDecoder(decoder, max_rows) if graphs else decoder
        problem = "does not reproduce this model's logits"
    except Exception as error:  # a variant it cannot even run: transformers' forward will
        problem = f"fails on this model ({type(error).__name__}: {error})"
    get_logger("engines.hf").warning(f"hf engine: the lean forward pass {problem}; using transformers' forward "
                                     "(slower). Please report the model.",
                                     model_type=getattr(model.config, "model_type", None))
    return TransformersDecoder(model)


def _reserved(request: _Request) -> int:
    """The KV-cache length a request may reach: its prompt and its token budget."""
    return len(request.prompt_ids) + request.sampling.max_tokens


def _kv_budget_tokens(model: Any, fraction: float | None) -> int | None:
    """`fraction` of the free GPU memory, in tokens of this model's KV cache (None off CUDA)."""
    import torch

    if fraction is None or model.device.type != "cuda":
        return None
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * heads * head_dim * model.dtype.itemsize  # keys and values
    free, _ = torch.cuda.mem_get_info(model.device)
    return int(free * fraction // per_token)


def _filling_holes(keep: list[int]) -> list[int]:
    """The kept rows in an order that moves as few as possible: rows among the first len(keep)
    stay where they are, and the places of the rows that left take the kept rows from beyond.
    (Every per-row state follows the same order, so the order itself does not matter.)"""
    count, kept = len(keep), set(keep)
    order = list(range(count))
    holes = [row for row in order if row not in kept]
    for hole, row in zip(holes, [row for row in keep if row >= count], strict=True):
        order[hole] = row
    return order


def _joined_masks(attention: Any, new_attention: Any) -> Any:
    """The attention masks of a batch and of the rows joining it, left-padded to the longer one and
    stacked (the caches are joined the same way: padding positions are masked out)."""
    import torch
    import torch.nn.functional as F

    width = max(attention.shape[1], new_attention.shape[1])
    return torch.cat([F.pad(attention, [width - attention.shape[1], 0]),
                      F.pad(new_attention, [width - new_attention.shape[1], 0])])


class _GrowingMask:
    """The batch's attention mask, with room for the tokens still to come: a decode step takes a view
    one column wider instead of concatenating a new column onto a fresh copy."""

    def __init__(self, attention: Any, spare: int = 64):
        self.length = attention.shape[1]
        self.buffer = _with_ones(attention, spare)

    def extend(self) -> Any:
        """The mask for the next step: one more attended position in every row."""
        if self.length == self.buffer.shape[1]:
            self.buffer = _with_ones(self.buffer, self.length)  # doubles: amortised O(1) per step
        self.length += 1
        return self.buffer[:, :self.length]

    def select(self, index: Any) -> None:
        self.buffer = self.buffer[index]

    def padding_columns(self) -> int:
        """How many leading columns no row attends to (every row attends to its own tokens, so the
        first attended column exists; one read from the device)."""
        return int(self.buffer[:, :self.length].any(0).int().argmax())

    def trim(self, columns: int) -> None:
        self.buffer = self.buffer[:, columns:]
        self.length -= columns


def _with_ones(mask: Any, columns: int) -> Any:
    """`mask` with `columns` more attended positions on the right."""
    import torch

    return torch.cat([mask, mask.new_ones((mask.shape[0], columns))], dim=1)


def _resolve(request: _Request, finish: FinishReason) -> None:
    if not request.future.done():
        generation = Generation(request.token_ids, request.logprobs, finish,
                                forced=request.forced if request.matcher is not None else None,
                                versions=request.versions)
        request.future.set_result(generation)
        if request.stream is not None:  # after the step's tokens: the loop runs callbacks in order
            request.stream.put_nowait(generation)


def _deliver(streamed: list[tuple[asyncio.Queue, int]]) -> None:
    for queue, token in streamed:
        queue.put_nowait(token)


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


def _priority(request: _Request) -> int:
    return request.sampling.priority


def _decode_executor(model: Any, threads: int | None) -> ThreadPoolExecutor:
    """The decode thread, with `threads` intra-op threads on CPU (None: torch's)."""
    return intra_op_executor("agenttune-hf-engine", threads if model.device.type == "cpu" else None)


def intra_op_executor(name: str, threads: int | None, *, workers: int = 1) -> ThreadPoolExecutor:
    """`workers` threads whose torch ops each run `threads` wide on CPU (None: torch's count).

    An OpenMP team belongs to the thread that starts it, so the caller's keeps its size. But
    `torch.set_num_threads` also sets the count threads started later begin with, so every worker is
    started now (each waits at a barrier until all have taken their count) and the caller's count is
    set again after."""
    import torch

    if not threads:
        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=_set_threads,
                                  initargs=(threads,))
    callers = torch.get_num_threads()
    started = threading.Barrier(workers)
    for future in [executor.submit(started.wait) for _ in range(workers)]:  # a blocked worker is not reused
        future.result()
    torch.set_num_threads(callers)
    return executor


def _set_threads(threads: int) -> None:
    import torch

    torch.get_num_threads()  # a thread's first call sets its count to the default: let it happen first
    torch.set_num_threads(threads)


def _half_the_threads() -> int:
    import torch

    return max(1, torch.get_num_threads() // 2)
