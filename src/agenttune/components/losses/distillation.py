"""On-policy distillation (Agarwal et al., 2024; Thinking Machines, 2025): the student samples, a
teacher scores the student's tokens, and each token's reverse KL is its (negative) advantage."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agenttune.components.losses.base import LossInput, LossOutput, PolicyLoss


class DistillationOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teacher: str = Field(description="The teacher model, which must share the student's tokenizer: for "
                                     "`teacher_engine: hf` or `vllm` a local directory (or Hugging Face id in the "
                                     "cache); for `openai` the served model's name.")
    teacher_engine: Literal["hf", "vllm", "openai"] = Field(
        default="hf", description="hf: the teacher is loaded beside the student and scores its packed batches at "
                                  "rollout.temperature. vllm: an in-process vLLM engine of its own (GPU; "
                                  "`pip install 'agenttune[vllm]'`) scores each sequence with vLLM's prompt log-probs "
                                  "(at temperature 1), asleep between steps; `teacher_engine_options` sets it up. "
                                  "openai: an OpenAI-compatible server that returns prompt log-probs at "
                                  "`teacher_base_url` scores each sequence (at temperature 1): `vllm serve TEACHER` "
                                  "or `agenttune serve --model TEACHER`.")
    teacher_engine_options: dict[str, Any] = Field(
        default_factory=dict, description="teacher_engine vllm: the teacher's vLLM engine, with the `vllm` engine's "
                                          "options (gpu_memory_utilization, tensor_parallel_size, enforce_eager, "
                                          "max_num_seqs, max_num_batched_tokens, enable_prefix_caching); sleep_level "
                                          "1 (the default here: KV cache freed, weights kept in CPU memory between "
                                          "steps) or 0 (stays on the GPU). Checked when the teacher starts.")
    teacher_base_url: str | None = Field(default=None, description="teacher_engine openai: the server's OpenAI base "
                                                                   "URL (ends in /v1).")
    teacher_api_key: str = Field(default="EMPTY", description="teacher_engine openai: the server's API key.")
    reward_weight: float = Field(default=0.0, ge=0.0, description="Add this times the estimator's advantage to every "
                                                                   "token's (0: pure distillation, rewards unused).")

    @model_validator(mode="after")
    def _engine_settings(self) -> DistillationOptions:
        if (self.teacher_engine == "openai") != (self.teacher_base_url is not None):
            raise ValueError("teacher_base_url is needed with teacher_engine: openai (the teacher server's base URL, "
                             "e.g. http://127.0.0.1:8000/v1) and only then; teacher_engine: hf and vllm load "
                             "`teacher` here")
        if self.teacher_engine_options and self.teacher_engine != "vllm":
            raise ValueError("teacher_engine_options sets up a vLLM teacher (teacher_engine: vllm) and only then; "
                             f"remove it for teacher_engine: {self.teacher_engine}")
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
