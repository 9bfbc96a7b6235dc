"""The `hf` engine's own forward pass for Llama-family decoders (llama, qwen2, qwen3, mistral).

A transformers model's forward pass does more per call than a decode step needs: it builds a 4-D
attention mask through the masking utilities, looks its attention function up, concatenates every
layer's KV cache into a fresh tensor, and goes through several decorators per layer. Where the
arithmetic is small — a small model, or any model on a GPU, whose decode loop is bound by the
Python that launches its kernels — that bookkeeping is much of the step. This module runs the same
layers — the model's own weights and submodules, in the order transformers calls them, so LoRA
adapters and the trained weights are used as they are — with what a decode step needs:

- the KV cache is preallocated per layer with spare columns; a step writes one column in place
  (transformers' `DynamicCache` copies the whole cache every step);
- the padding mask is one boolean tensor per step, shared by all layers;
- the rotary embedding is computed once per step by the model's own `rotary_emb` module;
- plain linear layers and the RMSNorms are called as the fused functions they are.

`python bench/decode_step.py` times a step both ways: on CPU 1.3-1.5x faster at 64-128 rows, 1.4x
for a 28-layer model at one row (the per-step overhead alone); on an H100, a 1.3 B model at 128 rows,
1.5x (19.9 ms against 30.0), and 6.9x (4.4 ms) with the step replayed as a CUDA graph
(components/engines/cuda_graphs.py).

`LeanDecoder.supports(model)` says which models qualify: the four architectures above, every layer
with full (not sliding-window) attention. Attention is torch's `scaled_dot_product_attention`
whatever kernel the model was loaded with (the same softmax(QK^T / sqrt(d)) V). Any other model runs
transformers' forward. `LeanDecoder.matches_transformers` is the engine's check when it starts:
one short prompt through both forward passes; a mismatch (an architecture variant this module does
not know) turns the lean path off with a warning. Tests check the logits against transformers'
forward within float32 noise for each architecture, through padding, joins and departures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})


class LeanCache:
    """Per-layer keys and values, (rows, kv_heads, capacity, head_dim), filled left to right.

    `length` columns are in use; rows are left-padded to it (the mask hides the padding, which is
    zeros). Each buffer keeps spare columns (half its length, at least 64), so appending a step is a
    write, not a copy of the cache; rows leaving or joining copy only the columns in use, once.
    """

    joinable = True  # (the engine asks every cache; transformers' may hold layers that cannot join)

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], length: int):
        self.keys, self.values, self.length = keys, values, length

    @classmethod
    def empty(cls, layers: int) -> LeanCache:
        return cls([torch.empty(0)] * layers, [torch.empty(0)] * layers, 0)

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's keys and values at columns `length...`; return the layer's filled part.
        (Every layer writes the same columns; `advance` moves `length` once per step.)"""
        start, end = self.length, self.length + keys.shape[2]
        if self.keys[layer].dim() < 4 or end > self.keys[layer].shape[2]:
            self.keys[layer] = _regrown(self.keys[layer], start, end, like=keys)
            self.values[layer] = _regrown(self.values[layer], start, end, like=values)
        self.keys[layer][:, :, start:end], self.values[layer][:, :, start:end] = keys, values
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, columns: int) -> None:
        self.length += columns

    def select(self, rows: list[int], index: torch.Tensor) -> None:
        """Keep only these rows, in this order (`index`: `rows` as a tensor on the cache's device).

        When only rows that stay move, and only into the first len(rows) places (finished rows
        leaving, in the order `hf._filling_holes` gives), the buffers are reused: the moved rows are
        copied and the rest stays put. Otherwise (a shared prompt's row copied) new buffers."""
        moved = [(place, row) for place, row in enumerate(rows) if place != row]
        if all(row >= len(rows) for _, row in moved):  # no row is overwritten before it is read
            if moved:
                places = torch.tensor([place for place, _ in moved], device=index.device)
                sources = torch.tensor([row for _, row in moved], device=index.device)
                for buffer in (*self.keys, *self.values):
                    used = buffer[:, :, :self.length]  # index_select/index_copy_ copy whole rows (fast)
                    used.index_copy_(0, places, used.index_select(0, sources))
            self.keys = [keys[:len(rows)] for keys in self.keys]
            self.values = [values[:len(rows)] for values in self.values]
            return
        self.keys = [_gathered(keys, index, self.length) for keys in self.keys]
        self.values = [_gathered(values, index, self.length) for values in self.values]

    def trim(self, columns: int) -> None:
        """Drop the first `columns` columns (padding in every row): views of the same buffers, no copy."""
        self.keys = [keys[:, :, columns:] for keys in self.keys]
        self.values = [values[:, :, columns:] for values in self.values]
        self.length -= columns

    def join(self, other: LeanCache) -> None:
        """Append `other`'s rows, both left-padded to the longer one (padding is masked out)."""
        width = max(self.length, other.length)
        for layer in range(len(self.keys)):
            self.keys[layer] = _stacked([(self.keys[layer], self.length), (other.keys[layer], other.length)], width)
            self.values[layer] = _stacked([(self.values[layer], self.length), (other.values[layer], other.length)],
                                          width)
        self.length = width


def _buffer(like: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """An uninitialised (rows, heads, columns + spare, dim) buffer of `like`'s type and device."""
    return like.new_empty((rows, like.shape[1], columns + max(64, columns // 2), like.shape[3]))


def _regrown(tensor: torch.Tensor, used: int, needed: int, *, like: torch.Tensor) -> torch.Tensor:
    grown = _buffer(like, like.shape[0], needed)
    if used:
        grown[:, :, :used] = tensor[:, :, :used]
    return grown


def _gathered(tensor: torch.Tensor, index: torch.Tensor, length: int) -> torch.Tensor:
    gathered = _buffer(tensor, len(index), length)
    torch.index_select(tensor[:, :, :length], 0, index, out=gathered[:, :, :length])
    return gathered


def _stacked(parts: list[tuple[torch.Tensor, int]], width: int) -> torch.Tensor:
    """The parts' rows one after the other, each part's `length` columns left-padded with zeros to `width`."""
    stacked = _buffer(parts[0][0], sum(tensor.shape[0] for tensor, _ in parts), width)
    row = 0
    for tensor, length in parts:
        rows = slice(row, row + tensor.shape[0])
        stacked[rows, :, :width - length] = 0
        stacked[rows, :, width - length:width] = tensor[:, :, :length]
        row += tensor.shape[0]
    return stacked


class LeanDecoder:
    """Forward passes of a supported model (`supports`), with a `LeanCache`."""

    lean = True

    def __init__(self, model: Any):
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.model = causal_lm
        self.body = causal_lm.model
        self.layers = list(self.body.layers)
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.scaling = attention.scaling
        self.qk_norm = hasattr(attention, "q_norm")  # qwen3 normalises queries and keys per head

    @staticmethod
    def supports(model: Any) -> bool:
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = getattr(causal_lm, "config", None)
        if getattr(config, "model_type", None) not in ARCHITECTURES:
            return False
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            return False  # mistral's window (and qwen's when switched on) needs a windowed mask
        if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
            return False
        if any(hasattr(module, "_hf_hook") for module in causal_lm.modules()):
            return False  # dispatched by accelerate (device_map, offloading): its hooks move the tensors
        body = getattr(causal_lm, "model", None)
        return all(hasattr(body, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")) and \
            hasattr(causal_lm, "lm_head")

    def matches_transformers(self) -> bool:
        """Whether a short prompt and one decode step give transformers' logits here (float32 noise;
        10 % of the logits' range in 16-bit types). Call under `torch.inference_mode()`, in eval mode.

        16-bit rounding differs between the two passes (the fused RMSNorm, other attention kernels)
        and grows with depth: a random-weight 28-layer 1.3 B model in bf16 differs by 1.95 % of its
        logits' range here on CPU, and by up to 2.9 % over 64 decode steps of 128 rows on an H100
        (bench/decode_step.py). A variant this module does not know (a missing or extra operation)
        moves the logits by a sizeable part of their range, so 10 % still catches it."""
        device = self.body.embed_tokens.weight.device
        vocab = self.body.embed_tokens.num_embeddings
        ids = (1 + torch.arange(6, device=device)[None] * (vocab // 7)) % vocab  # six different tokens
        attention = torch.ones_like(ids)
        positions = torch.arange(6, device=device)[None]
        cache = self.new_cache()
        lean = [self.forward(ids[:, :5], attention[:, :5], positions[:, :5], cache),
                self.forward(ids[:, 5:], attention, positions[:, 5:], cache)]
        reference = self.model(input_ids=ids, use_cache=False).logits[0, 4:].float()
        difference = (torch.cat(lean) - reference).abs().max()
        tolerance = 1e-4 if self.body.embed_tokens.weight.dtype == torch.float32 else 0.1
        return bool(difference <= tolerance * reference.abs().max().clamp(min=1.0))

    def new_cache(self) -> LeanCache:
        return LeanCache.empty(len(self.layers))

    def forward(self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
                cache: LeanCache) -> torch.Tensor:
        """The last position's logits (float32) for `input_ids` (rows, new columns), whose rows attend
        to the cache's columns and their own earlier new columns where `attention` (rows, all
        columns, 1 = a real token) says so. Appends the new keys and values to `cache`."""
        new = input_ids.shape[1]
        mask = _attention_mask(attention.bool(), new)

        def attend(layer: int, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            keys, values = cache.write(layer, keys, values)
            return attention_output(queries, keys, values, mask, self.scaling)

        logits = self.run(input_ids, positions, attend)
        cache.advance(new)
        return logits

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The model's layers on `input_ids`, with `attend(layer, queries, keys, values)` (each
        (rows, heads, new, head_dim), rotated) storing the new keys and values wherever the caller
        keeps them and returning the attention output, (rows, heads, new, head_dim). The last
        position's logits, float32. `forward` attends through a `LeanCache`; components/engines/cuda_graphs.py
        through the fixed storage a CUDA graph replays."""
        rows, new = input_ids.shape
        hidden = self.body.embed_tokens(input_ids)
        cos, sin = self.body.rotary_emb(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        for index, layer in enumerate(self.layers):
            module = layer.self_attn
            queries, keys, values = self._project(module, _norm(layer.input_layernorm, hidden), cos, sin)
            output = attend(index, queries, keys, values).transpose(1, 2).reshape(rows, new, -1)
            hidden = hidden + _linear(module.o_proj, output)
            hidden = hidden + _mlp(layer.mlp, _norm(layer.post_attention_layernorm, hidden))
        last = _norm(self.body.norm, hidden[:, -1:])
        return _linear(self.model.lm_head, last)[:, -1].float()

    def _project(self, attention: Any, hidden: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of `hidden`, (rows, heads, new, head_dim); queries and keys rotated."""
        rows, new, _ = hidden.shape
        shape = (rows, new, -1, self.head_dim)
        queries, keys = _linear(attention.q_proj, hidden).view(shape), _linear(attention.k_proj, hidden).view(shape)
        if self.qk_norm:
            queries, keys = _norm(attention.q_norm, queries), _norm(attention.k_norm, keys)
        queries, keys = queries.transpose(1, 2), keys.transpose(1, 2)
        values = _linear(attention.v_proj, hidden).view(shape).transpose(1, 2)
        return _rotate(queries, cos, sin), _rotate(keys, cos, sin), values


Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attention_output(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     scaling: float) -> torch.Tensor:
    """softmax(QK^T * scaling + mask) V, (rows, heads, new, head_dim), for grouped or plain heads."""
    heads, kv_heads = queries.shape[1], keys.shape[1]
    if queries.shape[2] == 1:
        return grouped_decode_attention(queries, keys, values, mask, scaling)
    if heads == kv_heads:
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scaling)
    if queries.device.type == "cpu":
        # The grouped kernel: faster on CPU than repeated heads (bench/decode_step.py, 128 rows x 200
        # tokens: 5.4 ms a step against 9.0 repeated).
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scaling, enable_gqa=True)
    # A prefill on CUDA: with a mask, its fused kernels take no grouped heads (torch would fall back
    # to its math kernel), so they are repeated, as transformers does.
    return F.scaled_dot_product_attention(queries, _repeat_heads(keys, heads), _repeat_heads(values, heads),
                                          attn_mask=mask, scale=scaling)


def grouped_decode_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                             scaling: float) -> torch.Tensor:
    """Attention of one new token per row, grouped or plain heads, without repeating key/value heads.

    Query head h reads key/value head h // group (transformers' `repeat_kv` order). With one query
    position, a group's query heads can stand as `group` query positions of their key/value head:
    (rows, kv_heads, group, dim) against (rows, kv_heads, columns, dim), the mask (rows, 1, 1,
    columns) the same for all of them. Exact, and the keys and values are read once instead of being
    copied `group` times (CUDA's fused kernels take no grouped heads beside a mask).

    On CPU the products are two batched matrix multiplications around a softmax: torch's CPU
    attention kernels cost more than the arithmetic at these sizes, and a whole decode step was 3-8 %
    faster this way (tiny://default, one thread: 16 rows x 20-token prompts 1.10 ms against 1.20;
    64 rows 2.54 against 2.73; 128 rows x 200 tokens 11.3 against 11.6)."""
    rows, heads, _, dim = queries.shape
    kv_heads, columns = keys.shape[1], keys.shape[2]
    grouped = queries.reshape(rows, kv_heads, heads // kv_heads, dim)
    if queries.device.type != "cpu":
        output = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scaling)
        return output.reshape(rows, heads, 1, dim)
    flat = rows * kv_heads  # one small product per (row, key/value head)
    scores = torch.bmm(grouped.reshape(flat, -1, dim), keys.reshape(flat, columns, dim).transpose(1, 2))
    scores = scores.view(rows, kv_heads, -1, columns).mul_(scaling).masked_fill_(~mask, float("-inf"))
    weights = scores.softmax(-1).view(flat, -1, columns)
    return torch.bmm(weights, values.reshape(flat, columns, dim)).view(rows, heads, 1, dim)


# A module call costs several microseconds of hooks and dispatch before its first operation; a decode
# step makes ~10 per layer. Plain layers are called as the functions they are; anything else (a LoRA
# layer, a quantized one, a kernel from the hub) through its own forward.
def _linear(module: Any, hidden: torch.Tensor) -> torch.Tensor:
    if type(module) is torch.nn.Linear:
        return F.linear(hidden, module.weight, module.bias)
    return module(hidden)


def _norm(module: Any, hidden: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm of these architectures as one fused operation: the float32 result is
    transformers' to the last bit or two; 16-bit types round once less."""
    if type(module).__name__ in RMS_NORMS and not module._forward_hooks and not module._forward_pre_hooks:
        return F.rms_norm(hidden, (hidden.shape[-1],), module.weight, module.variance_epsilon)
    return module(hidden)


def _mlp(module: Any, hidden: torch.Tensor) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), transformers' MLP of these architectures."""
    return _linear(module.down_proj, module.act_fn(_linear(module.gate_proj, hidden)) * _linear(module.up_proj, hidden))


def _repeat_heads(states: torch.Tensor, heads: int) -> torch.Tensor:
    """(rows, kv_heads, columns, dim) -> (rows, heads, columns, dim): each key/value head repeated
    for the query heads that share it (transformers' `repeat_kv`)."""
    rows, kv_heads, columns, dim = states.shape
    return states[:, :, None].expand(rows, kv_heads, heads // kv_heads, columns, dim).reshape(rows, heads, columns, dim)


def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = states.shape[-1] // 2
    rotated = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return states * cos + rotated * sin


def _attention_mask(attention: torch.Tensor, new: int) -> torch.Tensor:
    """(rows, 1, new, columns) booleans: a query attends to real tokens at or before its own column.

    A padding query attends to itself too: a query with nothing to attend to gives NaN, and NaN
    keys and values in the cache would poison every later step (0 x NaN is NaN), masked or not."""
    columns = attention.shape[1]
    mask = attention[:, None, None, :]
    if new == 1:
        return mask
    ones = torch.ones((new, columns), dtype=torch.bool, device=attention.device)
    itself = ones.tril(columns - new) & ~ones.tril(columns - new - 1)
    return (mask | itself) & ones.tril(columns - new)
