"""A judge's per-agent rewards (policies.reward: per_agent) reach the episode (real gateway, scripted
engine); a non-finite one fails only its episode, with a message saying why."""

from __future__ import annotations

from agenttune import Judge, JudgeInput, JudgeResult, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EpisodeStatus
from agenttune.workflow.task import Task


class WriterAndCritic(Workflow):
    async def execute(self, task, tuner):
        for agent in ("writer", "critic"):
            client = tuner.as_async_openai_client(agent=agent)
            await client.chat.completions.create(model=tuner.model_name,
                                                 messages=[{"role": "user", "content": task.query}])
        return WorkflowOutput()


class EachAgentJudge(Judge):
    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        critic = float(judge_input.task.metadata.get("critic", 1.0))
        return JudgeResult(reward=0.5, agent_rewards={"writer": 0.0, "critic": critic})


async def run(task: Task):
    engine = ScriptedEngine(["A line."], tokenizer=tiny_tokenizer(), cycle=True)
    config = tiny_config(rollout={"num_repeat": 1, "max_env_worker": 1}, judge={"isolation": "thread"})
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, WriterAndCritic, EachAgentJudge()) as rollout:
        return await rollout.run_tasks([task])


async def test_agent_rewards_reach_the_episode_beside_the_teams():
    [episode] = await run(Task(task_id="t", query="Write a line."))
    assert episode.status is EpisodeStatus.OK, episode.error
    assert episode.reward == 0.5 and episode.agent_rewards == {"writer": 0.0, "critic": 1.0}
    assert {sample.agent for sample in episode.samples} == {"writer", "critic"}


async def test_a_non_finite_agent_reward_fails_only_that_episode_and_says_why():
    [episode] = await run(Task(task_id="t", query="Write a line.", metadata={"critic": float("nan")}))
    assert episode.status is EpisodeStatus.JUDGE_ERROR
    assert "non-finite agent reward" in (episode.error or "")
