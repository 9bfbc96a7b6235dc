"""A plain OpenAI-client agent with one tool, wrapped in an agenttune Workflow.

`FactsAgent` is the kind of agent you already have: it takes an `openai.AsyncOpenAI` client, offers
the model a `lookup_country` tool, runs the tool calls it gets, and returns the model's final answer.
Nothing in it knows about agenttune. `FactsWorkflow` is the whole adapter: it hands the agent the
episode's client (`tuner.as_async_openai_client()`) and hands the answer to the judge.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.workflow.tuner import ModelTuner

SYSTEM_PROMPT = "Answer the question about a country. Look the country up first, then answer in a few words."

COUNTRIES = {
    "france": {"capital": "Paris", "currency": "euro", "continent": "Europe"},
    "japan": {"capital": "Tokyo", "currency": "yen", "continent": "Asia"},
    "kenya": {"capital": "Nairobi", "currency": "shilling", "continent": "Africa"},
    "peru": {"capital": "Lima", "currency": "sol", "continent": "South America"},
    "canada": {"capital": "Ottawa", "currency": "dollar", "continent": "North America"},
    "norway": {"capital": "Oslo", "currency": "krone", "continent": "Europe"},
}

LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_country",
        "description": "Facts about a country: capital, currency, continent.",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string", "description": "The country's English name."}},
            "required": ["country"],
        },
    },
}


def lookup_country(country: str = "") -> str:
    facts = COUNTRIES.get(str(country).strip().lower())
    return json.dumps(facts) if facts else json.dumps({"error": f"unknown country {country!r}"})


class FactsAgent:
    """Chat, run the tools the model asks for, repeat until it answers (or `max_turns` calls)."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, *, max_turns: int = 3):
        self.client = client
        self.model = model
        self.max_turns = max_turns

    async def run(self, question: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                          {"role": "user", "content": question}]
        for _ in range(self.max_turns):
            try:
                response = await self.client.chat.completions.create(
                    model=self.model, messages=messages, tools=[LOOKUP_TOOL], max_tokens=64)
            except openai.BadRequestError as error:
                if error.code == "context_length_exceeded":  # the conversation no longer fits: stop here
                    break
                raise
            message = response.choices[0].message
            if not message.tool_calls:
                return message.content or ""
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
        return ""


def run_tool(call: Any) -> str:
    if call.function.name != "lookup_country":
        return json.dumps({"error": f"no tool named {call.function.name!r}"})
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        return json.dumps({"error": "the arguments are not valid JSON"})
    if not isinstance(arguments, dict) or set(arguments) - {"country"}:
        return json.dumps({"error": 'expected {"country": ...}'})
    return lookup_country(**arguments)


class FactsWorkflow(Workflow):
    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        agent = FactsAgent(tuner.as_async_openai_client(), tuner.model_name,
                           max_turns=tuner.config.rollout.max_turns)
        answer = await agent.run(task.query)
        tuner.update_judge_input_dictionary(final_answer=answer)
        return WorkflowOutput(metadata={"final_answer": answer})
