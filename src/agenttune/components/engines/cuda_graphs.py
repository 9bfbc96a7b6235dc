"""Decode steps of the lean forward pass (components/engines/lean_decoder.py) replayed as CUDA graphs.

On a GPU, a decode step of a small or mid-sized model is bound by the CPU that launches its
kernels, about twenty per layer: on the H100 machine, the 1.3 B bench model at 128 rows took
14-20 ms a step through the lean pass and 20-30 ms through transformers' (`bench/decode_step.py`),
while reading its weights takes about 1 ms. A CUDA graph launches a whole recorded step at once:
4.4 ms replayed (docs/performance.md).

A graph replays fixed kernels on fixed memory, so the step it records is written for that:

- The KV cache lives in one storage per layer, (max_batch_size rows, a power-of-two number of
  columns), allocated once and zero-filled. The batch's `LeanCache` views the storage's first rows;
  a cache that left it (new buffers after a join, a reorder or a prefill) is copied back in at the
  next step (`StaticKV.adopt`). Contexts that outgrow the columns move to a storage twice as wide.
- A step attends over all the storage's columns; the mask hides the ones a row does not use. The
  new token's column is a device tensor the graph reads.
- Rows are padded up to a bucket (1, 2, 4, 8, then multiples of 16); padding rows compute on what
  their storage rows hold and their logits are dropped. Every mask row keeps at least one attended
  column, so no row ever makes NaN (a NaN key or value would poison later steps even masked: 0 x NaN).
- Queries of grouped heads attend as (rows, kv_heads, group, dim)
  (`lean_decoder.grouped_decode_attention`, through `attention_output`).

One graph per row bucket is captured when first needed and kept; a new storage, or parameters
that are no longer the tensors the graphs read (a model reloaded, an adapter added: optimizer steps
and `update_weights` write in place and keep them), drop the graphs. A storage that would take
more than a quarter of the free GPU memory is not made: such steps run the lean pass unrecorded.
Without CUDA the same fixed-storage step runs unrecorded (`capture=False`; the attention then
takes the CPU's batched products): that is what the tests on CPU check against the lean pass.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from agenttune.components.engines.lean_decoder import LeanCache, LeanDecoder, attention_output

STORAGE_MEMORY_SHARE = 0.25  # the most of the free GPU memory a KV storage may take
MIN_COLUMNS = 256


def row_bucket(rows: int, most: int) -> int:
    """The graph size a step of `rows` rows runs in: 1, 2, 4, 8, then multiples of 16, at most `most`."""
    bucket = 1
    while bucket < rows and bucket < 8:
        bucket *= 2
    if bucket < rows:
        bucket = -(-rows // 16) * 16
    return min(bucket, most)


class StaticKV:
    """Keys and values of every layer in fixed buffers, with the step's inputs beside them."""

    def __init__(self, like: LeanCache, rows: int, columns: int):
        def zeros(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.new_zeros((rows, tensor.shape[1], columns, tensor.shape[3]))

        self.keys = [zeros(keys) for keys in like.keys]
        self.values = [zeros(values) for values in like.values]
        self.rows, self.columns = rows, columns
        device = self.keys[0].device
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        # Every row attends somewhere (see the module docstring): rows not in the batch attend everywhere.
        self.mask = torch.ones((rows, 1, 1, columns), dtype=torch.bool, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)

    @staticmethod
    def size(cache: LeanCache, rows: int, columns: int) -> int:
        """Bytes of a storage for `cache`'s layers."""
        return sum(rows * tensor.shape[1] * columns * tensor.shape[3] * tensor.element_size()
                   for tensor in (*cache.keys, *cache.values))

    def holds(self, cache: LeanCache) -> bool:
        keys = cache.keys[0]
        return keys.data_ptr() == self.keys[0].data_ptr() and keys.shape[2] == self.columns

    def adopt(self, cache: LeanCache) -> None:
        """Copy `cache`'s rows into the first rows of the storage, which it views from now on. (A cache
        trimmed on the left still views this storage, further right: it is copied out first, as the
        two regions overlap.)"""
        rows, length = cache.keys[0].shape[0], cache.length
        for layer in range(len(self.keys)):
            keys, values = cache.keys[layer][:, :, :length], cache.values[layer][:, :, :length]
            if keys.untyped_storage().data_ptr() == self.keys[layer].untyped_storage().data_ptr():
                keys, values = keys.clone(), values.clone()
            self.keys[layer][:rows, :, :length] = keys
            self.values[layer][:rows, :, :length] = values
            cache.keys[layer], cache.values[layer] = self.keys[layer][:rows], self.values[layer][:rows]


class GraphedDecoder:
    """A `LeanDecoder` whose decode steps (one new token per row) run on a `StaticKV`, recorded as
    CUDA graphs when `capture`; prefills run the lean pass as they are."""

    lean = True

    def __init__(self, decoder: LeanDecoder, max_rows: int, *, capture: bool = True):
        self.decoder = decoder
        self.max_rows = max_rows
        self.capture = capture
        self.storage: StaticKV | None = None
        self.graphs: dict[int, Any] = {}  # row bucket -> its recorded step (a torch.cuda.CUDAGraph)
        self.output: torch.Tensor | None = None  # every graph's logits, (max_rows, vocabulary) float32
        self.pool: Any = None
        self.weights: tuple[int, ...] = ()
        self.graph_steps = 0  # decode steps run on the storage (replayed, when capturing)
        self.captures = 0  # graphs recorded
        self.too_large = 1 << 62  # columns from which no storage fits in memory
        self.failed = False  # a capture failed: every step runs the lean pass

    def new_cache(self) -> LeanCache:
        return self.decoder.new_cache()

    def forward(self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
                cache: LeanCache) -> torch.Tensor:
        rows, new = input_ids.shape
        if new != 1 or rows > self.max_rows or self.failed or not self._storage_for(cache):
            return self.decoder.forward(input_ids, attention, positions, cache)
        storage = self.storage
        assert storage is not None  # (_storage_for made it)
        columns = attention.shape[1]  # the cache's columns and the new one
        storage.tokens[:rows].copy_(input_ids)
        storage.positions[:rows].copy_(positions)
        storage.mask[:rows].copy_(F.pad(attention.bool(), (0, storage.columns - columns)).view(rows, 1, 1, -1))
        storage.column.fill_(cache.length)
        bucket = row_bucket(rows, self.max_rows)
        try:
            logits = self._replay(bucket) if self.capture else self._step(bucket)
        except RuntimeError as error:  # a layer that cannot be recorded (a kernel that syncs, say)
            self._give_up(error)
            return self.decoder.forward(input_ids, attention, positions, cache)
        cache.advance(1)
        self.graph_steps += 1
        return logits[:rows].clone()  # the graphs' output is overwritten by the next replay

    def _give_up(self, error: Exception) -> None:
        """After a failed capture: the lean pass from now on. The step is then run by it; the
        warm-up had written this column's keys and values, which it writes again, the same."""
        from agenttune.config.run import get_logger

        self.failed = True
        self.graphs.clear()
        self.storage = None
        get_logger("engines.hf").warning(
            "hf engine: a decode step could not be recorded as a CUDA graph; decoding without graphs "
            "(slower). Set engine.cuda_graphs: false to skip the attempt.", error=f"{type(error).__name__}: {error}")

    def _storage_for(self, cache: LeanCache) -> bool:
        """Whether the step can run on the storage; moves `cache` into it (a wider one if needed)."""
        needed = cache.length + 1
        if needed >= self.too_large:
            return False
        storage = self.storage
        if storage is not None and storage.holds(cache) and needed <= storage.columns:
            return True
        if storage is None or needed > storage.columns:
            columns = max(MIN_COLUMNS, 1 << (needed - 1).bit_length())
            if not self._fits(cache, columns):
                self.too_large = columns
                return False
            self.graphs.clear()
            storage = self.storage = StaticKV(cache, self.max_rows, columns)
        self._check_weights()  # (a batch's first step always lands here: its prefill made a new cache)
        storage.adopt(cache)
        return True

    def _fits(self, cache: LeanCache, columns: int) -> bool:
        held = StaticKV.size(cache, self.max_rows, self.storage.columns) if self.storage is not None else 0
        available = free_memory(cache.keys[0].device) + held  # (the storage in hand goes when replaced)
        return StaticKV.size(cache, self.max_rows, columns) <= STORAGE_MEMORY_SHARE * available

    def _check_weights(self) -> None:
        """Drop the graphs when the parameters are other tensors than the ones they read."""
        weights = tuple(parameter.data_ptr() for parameter in self.decoder.model.parameters())
        if weights != self.weights:
            self.graphs.clear()
            self.weights = weights

    def _step(self, rows: int) -> torch.Tensor:
        """The decode step of the storage's first `rows` rows: what a graph records."""
        storage = self.storage
        assert storage is not None
        mask, column = storage.mask[:rows], storage.column

        def attend(layer: int, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            stored_keys, stored_values = storage.keys[layer][:rows], storage.values[layer][:rows]
            stored_keys.index_copy_(2, column, keys)
            stored_values.index_copy_(2, column, values)
            return attention_output(queries, stored_keys, stored_values, mask, self.decoder.scaling)

        return self.decoder.run(storage.tokens[:rows], storage.positions[:rows], attend)

    def _replay(self, rows: int) -> torch.Tensor:
        graph = self.graphs.get(rows)
        if graph is None:
            graph = self.graphs[rows] = self._record(rows)
        graph.replay()
        assert self.output is not None  # (_record made it)
        return self.output

    def _record(self, rows: int) -> Any:
        """Capture the step of `rows` rows, its logits copied into `self.output` (one buffer for
        every graph: a graph's own output would stay allocated, (rows, vocabulary) floats each).
        The warm-up run outside the capture does the step's one-time work (cuBLAS handles, kernel
        choices); with the inputs already in place it writes the same keys and values the replay
        then writes again.

        `torch.cuda.graph` would also empty torch's cache of free GPU memory before each capture:
        the trainer that shares this GPU would then allocate its activations afresh at its next
        step. So the capture is begun and ended here, without that."""
        assert self.storage is not None
        device = self.storage.keys[0].device
        with torch.cuda.device(device):  # (the model may sit on another GPU than the current one)
            return self._record_on(device, rows)

    def _record_on(self, device: torch.device, rows: int) -> Any:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            vocabulary = self._step(rows).shape[-1]
        torch.cuda.synchronize(device)
        if self.output is None:
            self.output = torch.empty((self.max_rows, vocabulary), dtype=torch.float32, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            # thread_local: the trainer's thread may use the GPU meanwhile (asynchronous training)
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                self.output[:rows].copy_(self._step(rows))
            finally:
                graph.capture_end()
        torch.cuda.current_stream(device).wait_stream(side)
        self.captures += 1
        return graph


def free_memory(device: torch.device) -> float:
    """Bytes a new tensor could take on `device`: free on the GPU plus what torch holds unused."""
    if device.type != "cuda":
        return float("inf")
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
