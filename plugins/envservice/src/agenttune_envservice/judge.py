"""The `env_service` judge: the environment's own evaluation of the episode's instance is the reward.

    judge:
      type: env_service
      sparse: false          # ask for the dense score (AppWorld: the fraction of checks passed)
      success_threshold: 1   # success when the score reaches it
      score_scale: 0.5       # optional shaping, as ASTune's AppWorld runs:
      success_bonus: 1.0     #   reward = 0.5 * score, plus 1 on success

reward = score * score_scale + (success_bonus if success else 0). The workflow must have used
`env_for(task, tuner)`; the instance is evaluated here, then released by the episode's cleanup.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import Judge, JudgeInput, JudgeResult
from agenttune_envservice.environment import Environment


class NoEnvironment(RuntimeError):
    """The episode has no live environment to evaluate."""


class EnvServiceJudgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sparse: bool = Field(default=False, description="Ask /evaluate for the sparse (pass/fail) score, not the dense one.")
    success_threshold: float = Field(default=1.0, description="The episode succeeds when the score reaches this.")
    score_scale: float = Field(default=1.0, description="Reward per point of score.")
    success_bonus: float = Field(default=0.0, description="Added to the reward on success.")
    evaluate_params: dict[str, Any] = Field(default_factory=dict, description="Extra `params` for /evaluate.")


class EnvServiceJudge(Judge):
    """Rewards an episode with its EnvService environment's evaluation."""

    name: ClassVar[str] = "env_service"
    isolation = "loop"  # it is handed the episode's live environment client
    Options: ClassVar[type[BaseModel]] = EnvServiceJudgeOptions
    options: EnvServiceJudgeOptions

    async def judge(self, judge_input: JudgeInput) -> JudgeResult:
        environment = judge_input.handed.get("env")
        if not isinstance(environment, Environment) or not environment.created:
            raise NoEnvironment(
                f"task {judge_input.task.task_id!r}: the workflow created no environment to evaluate. Call "
                "`env = env_for(task, tuner)` and `await env.reset()` in the workflow (from agenttune_envservice).")
        score = await environment.evaluate(sparse=self.options.sparse, params=self.options.evaluate_params)
        success = score >= self.options.success_threshold
        reward = score * self.options.score_scale + (self.options.success_bonus if success else 0.0)
        return JudgeResult(reward=reward, success=success, details={
            "env_score": score,
            "env_steps": environment.steps,
            "env_terminated": environment.terminated,
            "instance_id": environment.instance_id,
        })
