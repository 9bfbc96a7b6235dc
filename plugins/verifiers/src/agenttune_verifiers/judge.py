"""The `verifiers` judge: the environment's own reward functions and judges score the episode.

    judge:
      type: verifiers
      success_threshold: 1.0    # success when the weighted reward reaches it
      timeout: 60               # agenttune's judge limits hold for the environment's reward functions

It rebuilds the verifiers task and the episode's trace (handed over by `VerifiersWorkflow`) and runs
`task.score(trace)`: the task's `@vf.reward` functions (weighted), plugged rewards and judges, and its
`@vf.metric`s. By default in a judge worker process, so a reward function that hangs or eats memory
ends the episode `judge_timeout` / `judge_memory` and the run goes on. A 0.1-0.3 environment's
Rubric scores the rollout's state the same way (legacy/scoring.py). Rewards that need the live
runtime (the box the agent ran in) are skipped: that box is gone by then.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import Judge, JudgeInput, JudgeResult
from agenttune_verifiers.loading import load_env, task_from_data
from agenttune_verifiers.options import METADATA_KEY


class NoTrace(RuntimeError):
    """The episode has no verifiers trace to score."""


class VerifiersJudgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    success_threshold: float = Field(default=1.0, description="The episode succeeds when its reward reaches this.")


class VerifiersJudge(Judge):
    """Scores an episode with its verifiers environment's rewards; metrics become `judge/metric/<name>`."""

    name: ClassVar[str] = "verifiers"
    Options: ClassVar[type[BaseModel]] = VerifiersJudgeOptions
    options: VerifiersJudgeOptions

    async def judge(self, judge_input: JudgeInput) -> JudgeResult:
        spec = judge_input.task.metadata.get(METADATA_KEY) or {}
        if spec.get("stack") == "legacy":
            return await self._judge_legacy(judge_input, spec)
        traces = judge_input.handed.get("verifiers_traces")
        if not traces:
            raise NoTrace(f"task {judge_input.task.task_id!r}: no verifiers trace to score; the workflow must be "
                          "agenttune_verifiers:VerifiersWorkflow")
        env = load_env(spec["env"])
        scored = [await _score(env, spec["task"], trace) for trace in traces]
        reward = sum(trace.reward for trace in scored) / len(scored)
        details: dict[str, Any] = {}
        for trace in scored:
            details.update({f"reward/{name}": r.score for name, r in trace.rewards.items() if r is not None})
            details.update({f"metric/{name}": value for name, value in trace.metrics.items() if value is not None})
        return JudgeResult(reward=reward, success=reward >= self.options.success_threshold, details=details)

    async def _judge_legacy(self, judge_input: JudgeInput, spec: dict[str, Any]) -> JudgeResult:
        from agenttune_verifiers.legacy.scoring import score_legacy

        state = judge_input.handed.get("verifiers_state")
        if not state:
            raise NoTrace(f"task {judge_input.task.task_id!r}: no verifiers state to score; the workflow must be "
                          "agenttune_verifiers:VerifiersWorkflow")
        reward, details = await score_legacy(spec["env"], state)
        return JudgeResult(reward=reward, success=reward >= self.options.success_threshold, details=details)


async def _score(env: Any, task_data: dict[str, Any], trace_data: dict[str, Any]) -> Any:
    import verifiers.v1 as vf

    task = task_from_data(env, task_data)
    trace = vf.Trace.model_validate(trace_data)
    await task.score(trace)
    return trace
