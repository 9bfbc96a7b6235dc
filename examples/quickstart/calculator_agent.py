"""The quickstart's agent: plain OpenAI-client code with one tool, a calculator.

Nothing here knows about training: the agent talks to `tuner.as_async_openai_client()` as it would to
any OpenAI-compatible server. agenttune's gateway behind that client records every token.
"""

from __future__ import annotations

import json

import openai
from arithmetic import CALCULATOR_TOOL, SYSTEM_PROMPT, calculate, parse_final_answer

from agenttune import Workflow, WorkflowOutput

MAX_TURNS = 3


class CalculatorAgent(Workflow):
    async def execute(self, task, tuner) -> WorkflowOutput:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.query}]
        reply = await converse(tuner.as_async_openai_client(), messages)
        answer = parse_final_answer(reply)
        tuner.update_judge_input_dictionary(final_answer=answer)
        return WorkflowOutput(metadata={"final_answer": answer, "turns": len(messages) - 2})


async def converse(client, messages: list[dict]) -> str:
    """Chat until the model answers without a tool call (at most MAX_TURNS calls), running its calculator
    calls; `messages` grows with the conversation. Returns the last reply's text."""
    reply = ""
    for _ in range(MAX_TURNS):
        try:
            response = await client.chat.completions.create(
                model="agent", messages=messages, tools=[CALCULATOR_TOOL], max_tokens=64)
        except openai.BadRequestError:  # e.g. the conversation outgrew the context window
            break
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        reply = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function)})
    return reply


def run_tool(function) -> str:
    if function.name != "calculator":
        return f"error: unknown tool {function.name!r}"
    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError:
        return "error: the arguments are not valid JSON"
    return calculate(str(arguments.get("expression", "")))
