"""The workflow, judge and helpers the bad-config corpus refers to (the valid parts of each config)."""

from agenttune import Judge, JudgeResult, Workflow, WorkflowOutput


class EchoAgent(Workflow):
    """One call to the model; the reward says whether it answered at all."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.query}])
        return WorkflowOutput(reward=float(bool(reply.choices[0].message.content)))


class NonEmptyJudge(Judge):
    async def judge(self, judge_input):
        return JudgeResult(reward=1.0, success=True)


def helper_function():
    """Not a workflow: configs that name it must be refused."""


NOT_A_CLASS = 42
