"""On-policy distillation (Agarwal et al., 2024; Thinking Machines, 2025): the student samples, a
teacher scores the student's tokens, and each token's reverse KL is its (negative) advantage."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.losses.base import LossInput, LossOutput, PolicyLoss


class DistillationOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teacher: str = Field(description="The teacher model: a local directory (or Hugging Face id in the cache) the "
                                     "`hf` engine loads; it must share the student's tokenizer.")
    reward_weight: float = Field(default=0.0, ge=0.0, description="Add this times the estimator's advantage to every "
                                                                   "token's (0: pure distillation, rewards unused).")


class DistillationLoss(PolicyLoss):
    """Per token, advantage A_t = log π_teacher(t) - log π_old(t) (minus the reverse KL's sample, so
    tokens the teacher finds likelier than the student are pushed up), plus `reward_weight` times the
    episode's advantage; loss -A_t r_t with r_t the policy ratio (exactly 1 on-policy: REINFORCE on
    the per-token advantage). No clipping."""

    name = "distillation"
    Options: ClassVar[type[BaseModel]] = DistillationOptions
    needs_teacher = True

    def __call__(self, batch: LossInput) -> LossOutput:
        import torch

        if batch.teacher_logprobs is None:
            raise ValueError("the distillation loss needs teacher log-probs (LossInput.teacher_logprobs)")
        reward_weight = self.options.reward_weight  # type: ignore[attr-defined]
        advantages = (batch.teacher_logprobs - batch.old_logprobs).detach()
        if reward_weight:
            advantages = advantages + reward_weight * batch.advantages.unsqueeze(-1)
        ratio = torch.exp(batch.logprobs - batch.old_logprobs)
        per_token = -advantages * ratio
        return LossOutput(per_token, torch.zeros_like(per_token))
