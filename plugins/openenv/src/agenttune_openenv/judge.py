"""The `openenv` judge: the rewards the environment gave the episode's steps become its reward.

    judge:
      type: openenv
      reduce: sum               # sum (default), last, max or mean of the step rewards
      success_threshold: 1.0    # success when the reward reaches it
      unfinished_reward: null   # a number: the reward of an episode whose environment never said done

OpenEnv environments compute rewards themselves (their rubric), on every step; the judge only
combines them. The workflow must have used `openenv_for(task, tuner)`; its session is read here,
then closed by the episode's cleanup. The step rewards are kept in the judge's details.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import Judge, JudgeInput, JudgeResult
from agenttune_openenv.session import HANDED_KEY, OpenEnvSession


class NoSession(RuntimeError):
    """The episode opened no OpenEnv session to take rewards from."""


class OpenEnvJudgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reduce: Literal["sum", "last", "max", "mean"] = Field(default="sum", description="How step rewards combine.")
    success_threshold: float = Field(default=1.0, description="The episode succeeds when its reward reaches this.")
    unfinished_reward: float | None = Field(
        default=None, description="Reward of an episode that stopped before the environment said done (none: "
                                  "its rewards so far).")


class OpenEnvJudge(Judge):
    """Rewards an episode with its OpenEnv environment's step rewards."""

    name: ClassVar[str] = "openenv"
    isolation = "loop"  # it is handed the episode's live session object
    Options: ClassVar[type[BaseModel]] = OpenEnvJudgeOptions
    options: OpenEnvJudgeOptions

    async def judge(self, judge_input: JudgeInput) -> JudgeResult:
        session = judge_input.handed.get(HANDED_KEY)
        if not isinstance(session, OpenEnvSession) or not session.opened:
            raise NoSession(
                f"task {judge_input.task.task_id!r}: the workflow opened no OpenEnv session. Call "
                "`env = openenv_for(task, tuner)` and `await env.reset()` in the workflow (from agenttune_openenv), "
                "or use the workflow agenttune_openenv:TextEnvWorkflow.")
        reward = self._reward(session)
        return JudgeResult(reward=reward, success=reward >= self.options.success_threshold, details={
            "env_rewards": list(session.rewards),
            "env_steps": session.steps,
            "env_done": session.done,
        })

    def _reward(self, session: OpenEnvSession) -> float:
        if not session.done and self.options.unfinished_reward is not None:
            return self.options.unfinished_reward
        rewards = session.rewards
        if not rewards:
            return 0.0
        reduce = self.options.reduce
        if reduce == "last":
            return rewards[-1]
        if reduce == "max":
            return max(rewards)
        if reduce == "mean":
            return sum(rewards) / len(rewards)
        return sum(rewards)
