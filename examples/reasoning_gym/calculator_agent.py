"""A reasoning-gym arithmetic agent with a calculator tool: what bench/environments.py trains.

The model may call `calculator` (+ - * on integers), then answers in `<answer>...</answer>` tags, which
the `reasoning_gym` judge scores with basic_arithmetic's own `score_answer`. A tiny model cannot
multiply 3-digit numbers in its head but can learn to copy the expression into the tool and its
result into the answer: RL has to find that out (as in examples/quickstart).
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

import openai

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.workflow.tuner import ModelTuner

SYSTEM_PROMPT = "Solve the problem. You may use the calculator. Answer as <answer>NUMBER</answer>."
MAX_TURNS = 3

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """+ - * on integers (and parentheses); anything else is an error message, not an exception."""
    try:
        return str(_evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError):
        return "error: not an arithmetic expression"


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10**7:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("unsupported expression")


def expression_of(question: str) -> str:
    """`Calculate 347 * 281.` -> `347 * 281` (basic_arithmetic's "simple" question style)."""
    return question.removeprefix("Calculate ").removesuffix(".")


def demonstration(rows: list[dict[str, Any]], *, use_tool: list[bool]) -> dict[str, Any]:
    """A warm-up conversation asking `rows`' questions ({"question", "answer"}) one after the other.

    Every answer is right; the assistant either calls the calculator first or states the answer at
    once. A tiny model cannot imitate the second kind on new problems; RL has to find that the first pays.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for index, (row, tool) in enumerate(zip(rows, use_tool, strict=True)):
        messages.append({"role": "user", "content": row["question"]})
        if tool:
            expression = expression_of(row["question"])
            call = {"id": f"call_{index}", "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": expression}}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"call_{index}", "content": calculate(expression)}]
        messages.append({"role": "assistant", "content": f"<answer>{row['answer']}</answer>"})
    return {"messages": messages, "tools": [CALCULATOR_TOOL]}


class CalculatorAgent(Workflow):
    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                          {"role": "user", "content": task.query}]
        reply = ""
        for _ in range(MAX_TURNS):
            try:
                response = await client.chat.completions.create(
                    model=tuner.model_name, messages=messages, tools=[CALCULATOR_TOOL])
            except openai.BadRequestError:  # e.g. the conversation outgrew the context window
                break
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            reply = message.content or ""
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function)})
        tuner.update_judge_input_dictionary(final_answer=reply)
        return WorkflowOutput(metadata={"final_answer": reply, "turns": len(messages) - 2})


def run_tool(function: Any) -> str:
    if function.name != "calculator":
        return f"error: unknown tool {function.name!r}"
    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError:
        return "error: the arguments are not valid JSON"
    if not isinstance(arguments, dict):
        return "error: expected {\"expression\": ...}"
    return calculate(str(arguments.get("expression", "")))
