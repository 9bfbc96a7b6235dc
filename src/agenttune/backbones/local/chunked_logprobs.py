"""Log-probs and entropy from the hidden states, the LM head applied to a chunk of tokens at a time.

The padded path asks the model for its logits: tokens x vocabulary, in the model's dtype, then a
float32 copy, then a softmax of the same size for the entropy, and as much again for the gradient.
With a 151,936-token vocabulary that is ~0.6 MB per token per copy. Here the model body runs alone
(`get_decoder()`), and `LinearLogprobs` turns its hidden states into log-probs `chunk_tokens` rows
at a time: a chunk's logits exist in float32 only while that chunk is processed, and the backward
recomputes them instead of keeping them. This is what TRL's selective log-softmax, verl's chunked
entropy and Liger's fused linear cross-entropy do in their own ways.

The gradient of log p(target) with respect to the logits is onehot(target) - softmax(logits), so
the backward needs only the chunk's logits (recomputed) and their log-sum-exp (kept: one float per
token). Tied embeddings need nothing special: the head's weight *is* the embedding's parameter and
autograd adds both gradients into it. A head that is not a plain `nn.Linear` (a LoRA-adapted
lm_head) is applied chunk by chunk under activation checkpointing instead, to the same effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional

from agenttune.backbones.local.prompt_sharing import model_mask
from agenttune.errors import UserError

if TYPE_CHECKING:
    from agenttune.backbones.local.packing import Packing


def packed_token_logprobs(
    model: torch.nn.Module, packing: Packing, *, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of the packed rows' scored targets, [M] each, without full logits."""
    causal = causal_lm(model)
    if packing.shared_rows and packing.attention_mask is None and not _separates_packed_samples(causal):
        import transformers

        raise UserError(
            f"transformers {transformers.__version__} does not keep packed samples apart under "
            f"{causal.config._attn_implementation!r} attention (it has no masking_utils.find_packed_sequence_indices).",
            hint="Upgrade transformers, or set local.update_path: padded.")
    body, head = causal.get_decoder(), causal.get_output_embeddings()
    mask = packing.attention_mask
    if mask is not None:  # units that share a prompt: their tree mask (prompt_sharing.py)
        mask = model_mask(mask, causal, head.weight.dtype)
    hidden = body(input_ids=packing.input_ids, position_ids=packing.position_ids, attention_mask=mask,
                  use_cache=False).last_hidden_state
    hidden = hidden.flatten(0, 1).index_select(0, packing.scored)  # only positions whose next token is trained
    return chunked_logprobs(hidden, head, packing.targets, temperature=temperature, with_entropy=with_entropy,
                            chunk_tokens=packing.chunk_tokens)


def _separates_packed_samples(causal: Any) -> bool:
    """Flash-attention reads restarting position ids as separate sequences; sdpa and eager need
    transformers' block-diagonal mask built from them (recent versions only)."""
    if "flash" in str(getattr(causal.config, "_attn_implementation", "")):
        return True
    from transformers import masking_utils

    return hasattr(masking_utils, "find_packed_sequence_indices")


def causal_lm(model: torch.nn.Module) -> Any:
    """The transformers causal LM inside `model` (a PeftModel wraps it; its LoRA layers sit inside)."""
    get_base_model = getattr(model, "get_base_model", None)
    causal = get_base_model() if callable(get_base_model) else model
    config = getattr(causal, "config", None)
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None) not in (None, 1.0):
            raise UserError(
                f"This model transforms its logits ({name}={getattr(config, name)!r}), which the packed, "
                "chunked update does not reproduce.",
                hint="Set local.update_path: padded for this model.")
    return causal


def chunked_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets[i] | hidden[i]) in float32 for hidden [M, H], and the entropy (without gradient).

    Logits are divided by `temperature` when it is positive and not 1, as in the padded path.
    """
    if type(head) is torch.nn.Linear:
        logprobs, entropy = LinearLogprobs.apply(hidden, head.weight, head.bias, targets, temperature,
                                                 chunk_tokens, with_entropy)
        return logprobs, entropy if with_entropy else None
    return _checkpointed_chunks(hidden, head, targets, temperature, with_entropy, chunk_tokens)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    logits = functional.linear(hidden, weight, bias).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return logits


def _scores(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """(log p(target), log-sum-exp, entropy or None) of float32 logits [c, V]."""
    normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, normaliser, entropy


class LinearLogprobs(torch.autograd.Function):
    """Log-probs of `targets` under softmax(hidden @ weight.T + bias), chunk by chunk, with a backward
    that recomputes each chunk's logits (so no [M, V] tensor outlives its chunk)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_tokens, with_entropy):
        count = hidden.shape[0]
        logprobs = torch.empty(count, dtype=torch.float32, device=hidden.device)
        normaliser = torch.empty_like(logprobs)
        entropy = torch.empty(count if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, count, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            logits = _logits(hidden[rows], weight, bias, temperature)
            logprobs[rows], normaliser[rows], chunk_entropy = _scores(logits, targets[rows], with_entropy)
            if chunk_entropy is not None:
                entropy[rows] = chunk_entropy
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, normaliser)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        hidden, weight, bias, targets, normaliser = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # float32 accumulators: a bf16 sum over many chunks would lose the small contributions
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_bias else None
        scale = ctx.temperature if ctx.temperature > 0 and ctx.temperature != 1.0 else 1.0
        for start in range(0, hidden.shape[0], ctx.chunk_tokens):
            rows = slice(start, start + ctx.chunk_tokens)
            chunk_hidden, upstream = hidden[rows], grad_logprobs[rows].float()
            # d log p(t) / d logits = onehot(t) - softmax(logits), in place in the recomputed logits
            grad = _logits(chunk_hidden, weight, bias, ctx.temperature)
            grad.sub_(normaliser[rows, None]).exp_().mul_(-upstream[:, None])
            grad.scatter_add_(-1, targets[rows, None], upstream[:, None])
            if scale != 1.0:
                grad.div_(scale)
            grad = grad.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad @ weight
            if grad_weight is not None:
                grad_weight += (grad.T @ chunk_hidden).float()
            if grad_bias is not None:
                grad_bias += grad.sum(0).float()
            del grad
        return (grad_hidden,
                None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype),
                None, None, None, None)


def _checkpointed_chunks(hidden, head, targets, temperature, with_entropy, chunk_tokens):
    """Any head module: each chunk's logits are recomputed in the backward by activation checkpointing."""
    from torch.utils.checkpoint import checkpoint

    def chunk(chunk_hidden: torch.Tensor, chunk_targets: torch.Tensor):
        logits = head(chunk_hidden).float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        logprobs, _, entropy = _scores(logits, chunk_targets, with_entropy)
        return logprobs, entropy

    logprobs, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        if torch.is_grad_enabled():
            values, entropy = checkpoint(chunk, hidden[rows], targets[rows], use_reentrant=False)
        else:
            values, entropy = chunk(hidden[rows], targets[rows])
        logprobs.append(values)
        entropies.append(entropy)
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None
