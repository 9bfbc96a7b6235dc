"""Cross-entropy on the sampled tokens: supervised fine-tuning inside the RL loop."""

from __future__ import annotations

from agenttune.components.losses.base import LossInput, LossOutput, PolicyLoss


class CrossEntropyLoss(PolicyLoss):
    """-A log π(token) per generated token: with advantage 1 (rejection_sampling) the negative
    log-likelihood of the episodes kept, averaged as `loss_agg_mode` says. No ratio, no clipping."""

    name = "cross_entropy"

    def __call__(self, batch: LossInput) -> LossOutput:
        import torch

        per_token = -batch.advantages.unsqueeze(-1) * batch.logprobs
        return LossOutput(per_token, torch.zeros_like(per_token))
