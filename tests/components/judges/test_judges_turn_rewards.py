"""A judge's per-call rewards reach the episode (real gateway, scripted engine, a two-call agent);
a judge that returns the wrong number of them fails only its episode, with a message saying why."""

from __future__ import annotations

import json

from agenttune import Judge, JudgeInput, JudgeResult, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EpisodeStatus
from agenttune.workflow.task import Task

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]
TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"word": "sky"}}\n</tool_call>'
ANSWER = "The answer is blue."


class LookupThenAnswer(Workflow):
    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        messages = [{"role": "user", "content": task.query}]
        first = (await client.chat.completions.create(model=tuner.model_name, messages=messages,
                                                      tools=TOOLS)).choices[0].message
        messages += [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": json.dumps({"sky": "blue"})}]
        final = (await client.chat.completions.create(model=tuner.model_name, messages=messages,
                                                      tools=TOOLS)).choices[0].message
        return WorkflowOutput(metadata={"final_answer": final.content})


class ToolCreditJudge(Judge):
    """The episode's reward, plus 0.1 for every call that used a tool well (the docs/judges.md example)."""

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        replies = [m for m in judge_input.messages if m["role"] == "assistant"]
        turns = [0.1 if message.get("tool_calls") else 0.0 for message in replies]
        if judge_input.task.metadata.get("miscount"):
            turns = turns[:1]
        return JudgeResult(reward=float("blue" in str(judge_input.output.metadata.get("final_answer"))),
                           turn_rewards=turns)


async def run(task: Task):
    tokenizer = tiny_tokenizer()
    engine = ScriptedEngine([TOOL_CALL, ANSWER], tokenizer=tokenizer, cycle=True)
    config = tiny_config(rollout={"num_repeat": 1, "max_env_worker": 1})
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, LookupThenAnswer, ToolCreditJudge()) as rollout:
        return await rollout.run_tasks([task])


async def test_turn_rewards_reach_the_episode_one_per_call():
    [episode] = await run(Task(task_id="t", query="What colour is the sky?"))
    assert episode.status is EpisodeStatus.OK, episode.error
    assert episode.num_calls == 2 and episode.turn_rewards == [0.1, 0.0] and episode.reward == 1.0


async def test_a_miscounted_turn_reward_list_fails_only_that_episode_and_says_why():
    [episode] = await run(Task(task_id="t", query="What colour is the sky?", metadata={"miscount": True}))
    assert episode.status is EpisodeStatus.JUDGE_ERROR
    assert "returned 1 turn_rewards for an episode of 2 model calls" in (episode.error or "")
