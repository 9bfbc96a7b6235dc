"""Workflows and a judge for the verl plugin's tests (loaded by reference, like a user's module)."""

from __future__ import annotations

import json

from agenttune import Judge, JudgeInput, JudgeResult, Workflow, WorkflowOutput

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}


class CalculatorWorkflow(Workflow):
    """A tool-using agent: asks the model, runs its `add` calls, and stops at a plain answer."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        messages = [{"role": "system", "content": "Use the add tool."}, {"role": "user", "content": task.query}]
        for _ in range(tuner.config.rollout.max_turns):
            reply = await client.chat.completions.create(model=tuner.model_name, messages=messages,
                                                         tools=[ADD_TOOL])
            message = reply.choices[0].message
            if not message.tool_calls:
                return WorkflowOutput(metadata={"final_answer": message.content})
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": str(arguments["a"] + arguments["b"])})
        return WorkflowOutput(metadata={"final_answer": None})


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


class AnswerJudge(Judge):
    name = "test_answer"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = str(judge_input.final_answer or "")
        solved = str(judge_input.task.ground_truth) in answer
        return JudgeResult(reward=1.0 if solved else 0.0, success=solved)
