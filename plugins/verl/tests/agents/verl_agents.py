"""Workflows and a judge for the verl plugin's tests (loaded by reference, like a user's module).

The tool agent most tests run is `agenttune.testing.agents:CalculatorWorkflow`; these are the odd ones.
"""

from __future__ import annotations

from agenttune import Judge, JudgeInput, JudgeResult, Workflow, WorkflowOutput


class RewritingWorkflow(Workflow):
    """Two calls whose second drops the first from the history: the timeline splits into two samples."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        first = await client.chat.completions.create(
            model=tuner.model_name, messages=[{"role": "user", "content": task.query}])
        summary = first.choices[0].message.content
        second = await client.chat.completions.create(
            model=tuner.model_name, messages=[{"role": "user", "content": f"Summary: {summary}. Answer now."}])
        return WorkflowOutput(metadata={"final_answer": second.choices[0].message.content})


class CrashingWorkflow(Workflow):
    async def execute(self, task, tuner):
        raise RuntimeError("the environment is down")


class FirstRepeatCrashesAfterAnswering(Workflow):
    """Answers with one model call; the group's first episode (repeat 0) then crashes, with tokens generated."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        reply = await client.chat.completions.create(
            model=tuner.model_name, messages=[{"role": "user", "content": task.query}])
        if tuner.episode_id.endswith("-0"):
            raise RuntimeError("the tool server went away after the answer")
        return WorkflowOutput(metadata={"final_answer": reply.choices[0].message.content})


class AnswerJudge(Judge):
    name = "test_answer"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = str(judge_input.final_answer or "")
        solved = str(judge_input.task.ground_truth) in answer
        return JudgeResult(reward=1.0 if solved else 0.0, success=solved)


class ShortAnswerJudge(Judge):
    """Shorter final answers score higher: the random tiny model's episodes then differ in reward, so GRPO's
    advantages are not all zero and every training step moves the weights (the CPU run checks they reach
    the rollout server)."""

    name = "test_short_answer"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = str(judge_input.final_answer or "")
        return JudgeResult(reward=1.0 / (1.0 + len(answer) / 16), success=len(answer) < 16)
