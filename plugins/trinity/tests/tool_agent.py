"""A small multi-turn tool agent (plain OpenAI client code) and its judge, as a user would write them."""

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
SYSTEM = "You are a careful calculator. Use the add tool, then answer."


class CalculatorWorkflow(Workflow):
    """Asks the model, runs the tool calls it makes, and stops at the first plain answer."""

    async def execute(self, task, tuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.query}]
        for _ in range(4):
            reply = await client.chat.completions.create(model=tuner.model_name, messages=messages, tools=[ADD_TOOL])
            message = reply.choices[0].message
            if not message.tool_calls:
                return WorkflowOutput(metadata={"final_answer": message.content})
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": str(arguments["a"] + arguments["b"])})
        return WorkflowOutput(metadata={"final_answer": None})


class ExactAnswerJudge(Judge):
    """Reward 1 when the final answer ends with the task's answer."""

    name = "exact_answer"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = (judge_input.final_answer or "").strip().rstrip(".")
        expected = str(judge_input.task.metadata["answer"])
        solved = answer.endswith(expected)
        return JudgeResult(reward=1.0 if solved else 0.0, success=solved)
