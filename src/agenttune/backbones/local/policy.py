"""Loading the model under training: device, dtype, LoRA, gradient checkpointing, the reference model."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import torch

from agenttune.backbones.local.options import local_options, trains_adapters
from agenttune.components.engines.model_loading import resolve_model_path, torch_dtype
from agenttune.config.models import AgentTuneConfig
from agenttune.config.run import get_logger
from agenttune.errors import UserError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

log = get_logger("local")

Policy: TypeAlias = "PreTrainedModel | PeftModel"  # a Hugging Face model, with a LoRA adapter or not


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UserError("local.device is 'cuda' but torch sees no CUDA device.",
                            hint="Set local.device: cpu (or auto), or install a CUDA build of torch.")
        return torch.device("cuda")
    return torch.device("cpu")


def load_pretrained(path: str, config: AgentTuneConfig, device: torch.device) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=torch_dtype(config.model.dtype, device.type),
            trust_remote_code=config.model.trust_remote_code,
        )
    except OSError as error:
        raise UserError(f"Cannot load the model from {path!r}: {error}",
                        hint="Check model.path (a local directory with config.json and weights).") from error
    # transformers declares PreTrainedModel.to with @wraps(nn.Module.to); mypy then reads the bound
    # method as the unbound one and takes `device` for `self`.
    return model.to(device)  # type: ignore[arg-type]


def load_policy(config: AgentTuneConfig, device: torch.device, *, checkpoint: Path | None = None) -> Policy:
    """The trainable policy: the base model, or a checkpoint's weights, with LoRA when configured.

    `checkpoint` is a checkpoint's `model/` directory: full weights, or a LoRA adapter on the base model.
    """
    lora = trains_adapters(config)
    weights = str(checkpoint) if checkpoint is not None and not lora else resolve_model_path(config.model.path)
    base = load_pretrained(weights, config, device)
    model: Policy = _with_lora(base, config, adapter=checkpoint) if lora else base
    if checkpointing_wanted(config, model, device):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            model.enable_input_require_grads()  # frozen embeddings would otherwise cut the graph
    model.config.use_cache = False
    return model


def checkpointing_wanted(config: AgentTuneConfig, model: torch.nn.Module, device: torch.device) -> bool:
    """`local.gradient_checkpointing`; with `auto`, whether the activations of the longest micro-batch
    (a rough estimate) would take more than half the memory that weights, gradients and AdamW leave."""
    local = local_options(config)
    if local.gradient_checkpointing != "auto":
        return bool(local.gradient_checkpointing)
    needed = activation_bytes(model.config, _longest_micro_batch(config))
    # weights; gradients; AdamW's two moments (on the CPU with optimizer_offload), in weight-sized units
    per_trained = 2 if local.optimizer_offload else 4
    states = sum(p.numel() * p.element_size() * (per_trained if p.requires_grad else 1) for p in model.parameters())
    wanted = needed > (_device_memory(device) - states) / 2
    if wanted:
        log.info(f"local.gradient_checkpointing: auto -> on (~{needed / 2**30:.1f} GiB of activations for "
                 f"{_longest_micro_batch(config)} tokens)")
    return wanted


def activation_bytes(model_config, tokens: int) -> int:
    """What one forward keeps for the backward, per token and layer ~ 8 x hidden + 4 x intermediate values
    (norm inputs, q/k/v, attention output, the MLP's gate, up and product), in the model's dtype.
    Attention scores are not counted: sdpa and flash-attention keep O(tokens) there."""
    dtype = getattr(model_config, "torch_dtype", None) or getattr(model_config, "dtype", None) or torch.float32
    size = torch.empty(0, dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4
    hidden = model_config.hidden_size
    intermediate = getattr(model_config, "intermediate_size", 4 * hidden)
    return tokens * model_config.num_hidden_layers * (8 * hidden + 4 * intermediate) * size


def _longest_micro_batch(config: AgentTuneConfig) -> int:
    """A micro-batch holds up to `micro_batch_tokens`, or one sample as long as the length limits allow."""
    prompt, response = config.data.length_limits()
    return max(local_options(config).micro_batch_tokens, prompt + response)


def _device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _with_lora(model: PreTrainedModel, config: AgentTuneConfig, *, adapter: Path | None) -> PeftModel:
    from peft import LoraConfig, PeftModel, get_peft_model

    local = local_options(config)
    if config.policies.enabled:  # one adapter per policy
        from agenttune.backbones.local.policies import with_adapters

        return with_adapters(model, config, checkpoint=adapter, lora_rank=local.lora_rank)
    if adapter is not None:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    lora_config = LoraConfig(
        r=local.lora_rank,
        lora_alpha=local.lora_alpha,
        target_modules=local.lora_target_modules,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora_config)


def reference_scope(config: AgentTuneConfig, policy: Policy, device: torch.device):
    """How to get reference log-probs for the KL penalty, or None when `algorithm.kl_coef` is 0.

    With LoRA the reference is the policy with its adapter switched off (no second copy of the
    weights). Without LoRA it is a frozen copy of the *base* model, also after a resume.
    """
    if config.algorithm.kl_coef <= 0:
        return None
    if trains_adapters(config):
        from peft import PeftModel

        assert isinstance(policy, PeftModel)  # load_policy wrapped it (lora_rank > 0)

        @contextmanager
        def adapter_off() -> Iterator[torch.nn.Module]:
            with policy.disable_adapter():
                yield policy
        return adapter_off
    base = load_pretrained(resolve_model_path(config.model.path), config, device)
    return frozen_reference(base)


def frozen_reference(model: torch.nn.Module) -> Callable:
    """A reference scope that always yields `model` (a frozen copy of the initial policy)."""
    model.eval()
    model.requires_grad_(False)
    return lambda: nullcontext(model)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(parameter.numel() for parameter in model.parameters())
    trainable = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    return trainable, total
