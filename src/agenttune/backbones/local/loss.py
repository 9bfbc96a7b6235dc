"""What the local trainer adds to the policy loss (`agenttune.components.losses`): the KL penalty, and how tokens are averaged.

All functions take per-token tensors of shape [rows, tokens] with a 0/1 `mask` marking the tokens
that are trained on (the model's own generated tokens).
"""

from __future__ import annotations

from typing import Literal

import torch

from agenttune.components.losses.base import LossAggregation

KLEstimator = Literal["k1", "k3"]


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens (Schulman's k1 / k3)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        # exp(-x) + x - 1 >= 0, unbiased, low variance; clamp keeps exp() finite on outliers.
        negative = torch.clamp(-log_ratio, min=-20.0, max=20.0)
        return torch.exp(negative) - negative - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}")


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggregation,
    *,
    total_tokens: int,
    total_sequences: int,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss.

    The denominators are mini-batch totals, so summing the shares of all micro-batches (gradient
    accumulation) gives exactly the loss of the whole mini-batch, however it was split.
    `token-mean` weighs every trained token equally; `seq-mean-token-mean` first averages within
    each sequence, so long and short responses weigh the same.
    """
    masked = per_token * mask
    if mode == "token-mean":
        return masked.sum() / max(total_tokens, 1)
    if mode == "seq-mean-token-mean":
        per_sequence = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_sequence.sum() / max(total_sequences, 1)
    raise ValueError(f"unknown loss aggregation {mode!r}")
