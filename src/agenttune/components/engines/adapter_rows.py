"""Rows of one batch sampled by different LoRA adapters (several policies in one run).

peft's LoRA layers take `adapter_names`, one name per row, and run each adapter on its own rows
(`_mixed_batch_forward`; the name "__base__" skips the adapters). peft passes that keyword down only
from `PeftModel.forward`; the `hf` engine's own forward pass (lean_decoder.py) calls the layers
directly, so the names are handed to every LoRA layer by the same forward pre-hooks peft installs
for it (`_enable_peft_forward_hooks`, a private method: peft is pinned in pyproject.toml's `local` extra).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from agenttune.config.policies import BASE_ADAPTER


def adapter_names(model: Any) -> tuple[str, ...]:
    """The LoRA adapters a peft model holds, in the order they were added; () for a plain model."""
    config = getattr(model, "peft_config", None)
    return tuple(config) if isinstance(config, dict) else ()


def rows_with_adapters(model: Any, adapters: list[str | None]) -> AbstractContextManager[Any]:
    """Within it, a forward pass runs row i with `adapters[i]` (None: the base model). A batch that
    names no adapter runs as before: with the model's active adapter, if any."""
    if not any(adapters):
        return nullcontext()
    names = [name or BASE_ADAPTER for name in adapters]
    return model.base_model._enable_peft_forward_hooks(adapter_names=names)
