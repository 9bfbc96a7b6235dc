"""The quickstart's task: arithmetic that a tiny model cannot do in its head, with a calculator tool.

Everything here is generated on the spot (no downloads): the questions, the held-out split, and the
demonstrations for the short supervised warm-up.
"""

from __future__ import annotations

import ast
import operator
import random
import re
import warnings
from typing import Any

from agenttune import Judge, JudgeInput, JudgeResult

SYSTEM_PROMPT = "Solve the arithmetic problem. You may use the calculator."

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

# The model's expressions are parsed as Python: "3or 4" makes `ast.parse` warn on stderr before it is
# refused ("<unknown>:1: SyntaxWarning: invalid decimal literal"); the tool answers it as an error already.
# A filter, not `catch_warnings()`, which swaps the process-wide filters while the trainer's thread uses them.
warnings.filterwarnings("ignore", message="invalid decimal literal", category=SyntaxWarning)


def calculate(expression: str) -> str:
    """Evaluate + - * on integers (and parentheses). Anything else is an error message, not an exception."""
    try:
        return str(_evaluate(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError):
        return "error: not an arithmetic expression"


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10**6:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError("unsupported expression")


def make_problem(rng: random.Random) -> tuple[str, int]:
    """`347 * 28`: a 3-digit times a 2-digit number with a 5-digit product.

    Impossible to do in a tiny model's head, trivial with the calculator. Every problem has the same
    shape, so copying it into the tool call (and the tool's result into the answer) is a fixed
    shift that a tiny transformer can learn quickly.
    """
    while True:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if a * b >= 10_000:
            return f"{a} * {b}", a * b


def make_tasks(count: int, seed: int, *, exclude: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Rows for the file task reader: {"task_id", "query", "ground_truth"}, with unique expressions."""
    rng, rows, seen = random.Random(seed), [], set(exclude)
    while len(rows) < count:
        expression, answer = make_problem(rng)
        if expression in seen:
            continue
        seen.add(expression)
        rows.append({"task_id": f"{seed}-{len(rows)}", "query": f"What is {expression}?",
                     "ground_truth": answer, "expression": expression})
    return rows


def final_answer_text(value: int | str) -> str:
    return f"The answer is {value}."


ANSWER = re.compile(r"answer is\s*(-?\d+)")


def parse_final_answer(text: str) -> int | None:
    match = ANSWER.search(text or "")
    return int(match.group(1)) if match else None


def demonstration(rows: list[dict[str, Any]], *, use_tool: list[bool]) -> dict[str, Any]:
    """One warm-up conversation in which the user asks the problems of `rows` one after the other.

    Every answer is correct: the assistant either calls the calculator and reports its result, or
    states the right answer straight away ("from memory"). A tiny model cannot imitate the second
    kind on new problems (it cannot multiply 3-digit numbers in its head), but imitation alone does
    not tell it that: RL has to discover that calling the calculator is what pays. Several problems
    per conversation share one system prompt, which makes the warm-up several times cheaper.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for index, (row, tool) in enumerate(zip(rows, use_tool, strict=True)):
        messages.append({"role": "user", "content": row["query"]})
        if tool:
            call = {"id": f"call_{index}", "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": row["expression"]}}}
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_{index}", "content": calculate(row["expression"])},
            ]
        messages.append({"role": "assistant", "content": final_answer_text(row["ground_truth"])})
    return {"messages": messages, "tools": [CALCULATOR_TOOL]}


class ArithmeticJudge(Judge):
    """Reward 1 when the agent's final answer equals the true value of the expression, else 0."""

    name = "arithmetic"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = judge_input.final_answer
        if answer is None:
            answer = parse_final_answer(judge_input.last_assistant_text)
        expected = int(judge_input.task.ground_truth)
        correct = answer is not None and int(answer) == expected
        return JudgeResult(reward=1.0 if correct else 0.0, success=correct,
                           details={"answer": answer, "expected": expected})
