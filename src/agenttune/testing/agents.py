"""A small multi-turn tool agent for backbone tests: plain OpenAI client code, as a user writes it.

`CalculatorWorkflow` offers the model one `add` tool, answers every call it makes, and stops at the
first plain answer (or after `rollout.max_turns` calls). Configs name it by reference:

    workflow: agenttune.testing.agents:CalculatorWorkflow

Its `final_answer` is the last reply's text; the judge that scores it belongs to each test suite,
since it depends on how that suite's tasks carry the expected answer.
"""

from __future__ import annotations

import json

from agenttune.workflow.base import Workflow, WorkflowOutput

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}
SYSTEM = "Use the add tool."


class CalculatorWorkflow(Workflow):
    """Asks the model, runs the `add` calls it makes, and stops at the first plain answer."""

    async def execute(self, task, tuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.query}]
        for _ in range(tuner.config.rollout.max_turns):
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
