"""The trainer's weights under the names vLLM's `load_weights` expects (no vLLM import: testable anywhere).

Hugging Face checkpoints and vLLM's model classes use the same parameter names (vLLM's loaders
read HF safetensors). A peft model adds its own wrapping, which this module strips:

    base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight  -> model.layers.0.self_attn.q_proj.weight
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight  -> (skipped: merged in)
    base_model.model.lm_head.modules_to_save.default.weight  -> lm_head.weight
    base_model.model.lm_head.original_module.weight  -> (skipped: the trained copy is sent)

LoRA goes to vLLM merged (`merge_adapter` before reading, `unmerge_adapter` after), as TRL's
colocate mode does, rather than as a vLLM LoRA adapter: vLLM then decodes with exactly the
weights the trainer's forward uses, at full speed (no punica kernels, no `max_lora_rank`, any
target module), and nothing is written to disk each step.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PEFT_PREFIX = "base_model.model."
# peft's own sub-modules: lora_A/lora_B/lora_embedding_A/B/lora_magnitude_vector (DoRA), then the adapter name.
_LORA_PART = re.compile(r"(^|\.)lora_[A-Za-z_]+(\.|$)")
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def vllm_weight_name(name: str) -> str | None:
    """A trainer parameter name -> the name vLLM's `load_weights` expects; None for weights vLLM has no slot for.

    None for LoRA's own matrices (they are merged into the base weights before sending) and for
    the frozen `original_module` copies of peft's `modules_to_save` (the trained copy is sent).
    """
    if _LORA_PART.search(name) or ".original_module." in name:
        return None
    name = name.removeprefix(PEFT_PREFIX)
    name = name.replace(".base_layer.", ".")
    return _MODULES_TO_SAVE.sub(".", name)


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")


@contextmanager
def vllm_weights(model: Any) -> Iterator[list[tuple[str, Any]]]:
    """The model's parameters as (vLLM name, tensor), LoRA merged in for the duration of the block.

    The tensors are the parameters themselves (no copy): read them inside the block. Tied weights
    come once (`named_parameters` skips the duplicate), as vLLM's loaders expect.
    """
    merge = is_peft_model(model)
    if merge:
        model.merge_adapter()
    try:
        named = ((vllm_weight_name(name), parameter.detach()) for name, parameter in model.named_parameters())
        yield [(name, tensor) for name, tensor in named if name is not None]
    finally:
        if merge:
            model.unmerge_adapter()
