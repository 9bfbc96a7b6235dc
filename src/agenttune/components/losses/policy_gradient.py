"""The built-in policy losses: PPO's clipped ratio, GSPO's sequence-level ratio, CISPO's clipped weight.

Each matches verl 0.9.1's policy loss of the same rule (`vanilla`, `gspo`, `cispo`); tests/losses
compares each with a direct computation.
"""

from __future__ import annotations

from agenttune.components.losses.base import LossInput, LossOutput, PolicyLoss


class PPOClipLoss(PolicyLoss):
    """PPO's pessimistic objective per token, max(-A r, -A clip(r, 1 - low, 1 + high)); a larger
    `clip_ratio_high` is DAPO's clip-higher. verl's `vanilla` loss (without its dual clip)."""

    name = "ppo_clip"

    def __call__(self, batch: LossInput) -> LossOutput:
        import torch

        ratio = torch.exp(batch.logprobs - batch.old_logprobs)
        advantages = batch.advantages.unsqueeze(-1)
        unclipped = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1.0 - batch.clip_low, 1.0 + batch.clip_high)
        return LossOutput(torch.maximum(unclipped, clipped), (clipped > unclipped).float())


class GSPOLoss(PolicyLoss):
    """GSPO (Zheng et al., 2025): one importance ratio per sequence, the geometric mean of its tokens'
    ratios, clipped as PPO clips a token's; averaged per sequence (`seq-mean-token-mean`). The paper
    clips at 3e-4 / 4e-4 (`clip_ratio_low` / `clip_ratio_high`), far tighter than PPO's 0.2."""

    name = "gspo"
    loss_agg_mode = "seq-mean-token-mean"

    def __call__(self, batch: LossInput) -> LossOutput:
        import torch

        log_ratio = batch.logprobs - batch.old_logprobs
        lengths = batch.mask.sum(-1).clamp(min=1.0)
        sequence_log_ratio = (log_ratio * batch.mask).sum(-1) / lengths
        # Each token carries the sequence's ratio as its value and its own log-prob's gradient (verl's form).
        token_log_ratio = batch.logprobs - batch.logprobs.detach() + sequence_log_ratio.detach().unsqueeze(-1)
        ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
        advantages = batch.advantages.unsqueeze(-1)
        unclipped = -advantages * ratio
        clipped = -advantages * torch.clamp(ratio, 1.0 - batch.clip_low, 1.0 + batch.clip_high)
        return LossOutput(torch.maximum(unclipped, clipped), (clipped > unclipped).float())


class CISPOLoss(PolicyLoss):
    """CISPO (MiniMax-M1, 2025): REINFORCE weighted by the importance ratio clipped to [1 - low, 1 + high]
    under a stop-gradient, -sg(clip(r)) A log π: a clipped token still gets its gradient."""

    name = "cispo"

    def __call__(self, batch: LossInput) -> LossOutput:
        import torch

        ratio = torch.exp(torch.clamp(batch.logprobs - batch.old_logprobs, min=-20.0, max=20.0))
        weight = torch.clamp(ratio, 1.0 - batch.clip_low, 1.0 + batch.clip_high).detach()
        per_token = -weight * batch.advantages.unsqueeze(-1) * batch.logprobs
        return LossOutput(per_token, (ratio != weight).float())
