"""On-policy distillation (Agarwal et al., 2024; Thinking Machines, 2025): the student samples, a
teacher scores the student's tokens, and each token's reverse KL is its (negative) advantage."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agenttune.losses.base import LossInput, LossOutput, PolicyLoss


class DistillationOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teacher: str = Field(description="The teacher model, which must share the student's tokenizer: for "
                                     "`teacher_engine: hf` a local directory (or Hugging Face id in the cache); for "
                                     "`openai` the served model's name.")
    teacher_engine: Literal["hf", "openai"] = Field(
        default="hf", description="hf: the teacher is loaded beside the student and scores its packed batches at "
                                  "rollout.temperature. openai: an OpenAI-compatible server that returns prompt "
                                  "log-probs at `teacher_base_url` scores each sequence (at temperature 1): `vllm "
                                  "serve TEACHER` (a vLLM teacher) or `agenttune serve --model TEACHER`.")
    teacher_base_url: str | None = Field(default=None, description="teacher_engine openai: the server's OpenAI base "
                                                                   "URL (ends in /v1).")
    teacher_api_key: str = Field(default="EMPTY", description="teacher_engine openai: the server's API key.")
    reward_weight: float = Field(default=0.0, ge=0.0, description="Add this times the estimator's advantage to every "
                                                                   "token's (0: pure distillation, rewards unused).")

    @model_validator(mode="after")
    def _server_for_openai(self) -> DistillationOptions:
        if (self.teacher_engine == "openai") != (self.teacher_base_url is not None):
            raise ValueError("teacher_base_url is needed with teacher_engine: openai (the teacher server's base URL, "
                             "e.g. http://127.0.0.1:8000/v1) and only then; teacher_engine: hf loads `teacher` here")
        return self


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
