"""Workflows that play the test server's guessing game, well and badly (for the rollout tests)."""

from __future__ import annotations

import asyncio

from agenttune_envservice import env_for

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.plugin_api import ModelTuner


class GuessWorkflow(Workflow):
    """The model guesses until the environment says the episode is over."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        env = env_for(task, tuner)
        messages = await env.reset()
        client = tuner.as_async_openai_client()
        observations = []
        for _ in range(tuner.config.rollout.max_turns):
            reply = await client.chat.completions.create(model=tuner.model_name, messages=messages)
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            observation, _reward, terminated, _info = await env.step(text)
            observations.append(observation)
            if terminated or tuner.context_overflow:
                break
            messages.append({"role": "user", "content": observation})
        return WorkflowOutput(metadata={"observations": observations, "instance_id": env.instance_id})


class RaisingWorkflow(Workflow):
    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        env = env_for(task, tuner)
        await env.reset()
        await env.step("5")
        raise ValueError("the agent crashed mid-episode")


class HangingWorkflow(Workflow):
    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        env = env_for(task, tuner)
        await env.reset()
        await asyncio.sleep(3600)
        return WorkflowOutput()


class NoResetWorkflow(Workflow):
    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        env_for(task, tuner)
        return WorkflowOutput()
