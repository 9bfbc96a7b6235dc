"""The `hf` engine's forward pass through the transformers model's own call: any causal LM.

The engine's other forward pass is components/engines/lean_decoder.py (llama-family models). Both show the
engine one interface: a decoder's `new_cache()` and `forward(input_ids, attention, positions, cache)`
(the last position's float32 logits), and a cache's `joinable`, `select(rows, index)`,
`trim(columns)` and `join(other)`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class TransformersCache:
    """A transformers `DynamicCache`, with the row operations the engine needs."""

    def __init__(self, cache: DynamicCache):
        # Any: its layers' declared types include kinds without keys; `join` runs only when joinable
        self.cache: Any = cache

    @property
    def joinable(self) -> bool:
        """Whether rows can join: plain per-layer key/value tensors (no sliding windows, no quantized
        or offloaded layers), which left-padding and concatenation keep exact."""
        layers = getattr(self.cache, "layers", None) or []
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    def select(self, rows: list[int], index: torch.Tensor) -> None:
        """Keep only these rows, in this order (`index`: `rows` as a tensor on the cache's device)."""
        self.cache.batch_select_indices(index)

    def trim(self, columns: int) -> None:
        """Drop the first `columns` columns (padding in every row)."""
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, columns:], layer.values[:, :, columns:]

    def join(self, other: TransformersCache) -> None:
        """Append `other`'s rows, both left-padded to the longer one (padding is masked out)."""
        layers, new_layers = self.cache.layers, other.cache.layers
        width = max(layers[0].keys.shape[-2], new_layers[0].keys.shape[-2])
        for layer, new_layer in zip(layers, new_layers, strict=True):
            layer.keys = torch.cat([_left_padded(layer.keys, width), _left_padded(new_layer.keys, width)])
            layer.values = torch.cat([_left_padded(layer.values, width), _left_padded(new_layer.values, width)])


def _left_padded(states: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, heads, columns, dim) with zero columns on the left up to `width`."""
    missing = width - states.shape[-2]
    return F.pad(states, [0, 0, missing, 0]) if missing else states


class TransformersDecoder:
    """Forward passes through `model(...)` with a `DynamicCache`."""

    lean = False

    def __init__(self, model: Any):
        self.model = model
        self.cache_keyword = _cache_keyword(model)

    def new_cache(self) -> TransformersCache:
        return TransformersCache(DynamicCache(config=self.model.config))

    def forward(self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
                cache: TransformersCache) -> torch.Tensor:
        output = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                            use_cache=True, logits_to_keep=1, **{self.cache_keyword: cache.cache})
        # Contiguous: grammar masking writes through the tensor's memory (a [:, -1] view is strided).
        return output.logits[:, -1, :].float().contiguous()


def _cache_keyword(model: Any) -> str:
    """transformers 5.x renames `past_key_values` to `cache` (the old name warns on every call, and
    goes in 5.40); 4.x knows only the old one. A peft model passes keywords on to its base model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
