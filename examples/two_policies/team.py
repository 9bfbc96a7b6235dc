"""The two-policy example's workflow: a proposer and a checker on the quickstart's arithmetic, with
opposed goals.

- `proposer` gets the problem and the calculator, in the quickstart's format, and answers ("The answer
  is 9716."). Its own reward is for a plausible wrong answer: wrong, with as many digits as the right
  one (the distractor of a multiple-choice question, the hard negative a verifier is trained on).
- `checker` gets the problem, the proposer's answer and the calculator, and must give the answer it
  vouches for: the proposal when it is right, the correct value when it is not. Copying the number in
  its prompt is what a warmed-up model does by default; the checker has to learn when not to.

So the roles need opposite behaviour from one base model on the same problems: the proposer gains by
not computing (a skipped calculator call, a digit changed), the checker by computing. One adapter
shared by both is pulled both ways; an adapter each is not (bench/multi_policy.py measures both).

Each agent talks to its own client, named as an AgentScope agent would be (`agent="proposer"`); the
YAML's `policies.agents` maps those names to policies, and `policies.reward: per_agent` trains each on
its own agent's reward.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

# The quickstart's task, calculator and agent loop, shared rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "quickstart"))

from arithmetic import (  # noqa: E402
    CALCULATOR_TOOL,
    SYSTEM_PROMPT,
    calculate,
    final_answer_text,
    parse_final_answer,
)
from calculator_agent import converse  # noqa: E402

from agenttune import Judge, JudgeInput, JudgeResult, Workflow, WorkflowOutput  # noqa: E402

CHECKER_PROMPT = "Check the proposed answer to the arithmetic problem. You may use the calculator."


def checker_question(query: str, proposed: int | None) -> str:
    proposal = "no answer" if proposed is None else f"The answer is {proposed}."
    return f"{query} Proposed: {proposal}"


def wrong_answer(value: int, rng: random.Random) -> int:
    """A plausible wrong product: one digit of `value` changed (the same length, so not told by its shape)."""
    digits = list(str(value))
    at = rng.randrange(1, len(digits))  # never the leading digit: the length stays
    digits[at] = rng.choice([digit for digit in "0123456789" if digit != digits[at]])
    return int("".join(digits))


def checker_demonstration(rows: list[dict[str, Any]], rng: random.Random, *, tool_fraction: float,
                          right_fraction: float = 0.5) -> dict[str, Any]:
    """One warm-up conversation in the checker's format: problems with a proposal, right or one digit off,
    each answered with the correct value, by calling the calculator (`tool_fraction` of them) or straight
    away. Straight away is a copy of the proposal when it is right, and a value the tiny model cannot
    produce when it is not: as in the quickstart's demonstrations, imitation teaches the format and RL
    has to find when the calculator pays. Without these the warmed-up model answers the checker's prompt,
    which it has never seen, with garbage (`8888.`)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": CHECKER_PROMPT}]
    for index, row in enumerate(rows):
        value = int(row["ground_truth"])
        proposed = value if rng.random() < right_fraction else wrong_answer(value, rng)
        messages.append({"role": "user", "content": checker_question(row["query"], proposed)})
        if rng.random() < tool_fraction:
            call = {"id": f"call_{index}", "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": row["expression"]}}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"call_{index}", "content": calculate(row["expression"])}]
        messages.append({"role": "assistant", "content": final_answer_text(value)})
    return {"messages": messages, "tools": [CALCULATOR_TOOL]}


class ProposerAndChecker(Workflow):
    async def execute(self, task, tuner) -> WorkflowOutput:
        answered = await converse(tuner.as_async_openai_client(agent="proposer"),
                                  [{"role": "system", "content": SYSTEM_PROMPT},
                                   {"role": "user", "content": task.query}])
        proposed = parse_final_answer(answered)
        checked = await converse(tuner.as_async_openai_client(agent="checker"),
                                 [{"role": "system", "content": CHECKER_PROMPT},
                                  {"role": "user", "content": checker_question(task.query, proposed)}])
        final = parse_final_answer(checked)
        tuner.update_judge_input_dictionary(final_answer=final)
        return WorkflowOutput(metadata={"final_answer": final, "proposed_answer": proposed})


def plausible_wrong(proposed: int | None, expected: int) -> bool:
    """A wrong answer that its shape does not give away: as many digits as the right one."""
    return proposed is not None and proposed != expected and len(str(proposed)) == len(str(expected))


class TeamJudge(Judge):
    """The team's answer is the checker's: reward and success (the held-out accuracy) 1 when it is right.
    Each agent's own reward (`policies.reward: per_agent`): the checker's, its answer right; the
    proposer's, a plausible wrong proposal (`plausible_wrong`)."""

    name = "proposer_and_checker"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        expected = int(judge_input.task.ground_truth)
        proposed = judge_input.output.metadata.get("proposed_answer")
        final = judge_input.final_answer
        checker_right = final is not None and int(final) == expected
        return JudgeResult(reward=float(checker_right), success=checker_right,
                           agent_rewards={"proposer": float(plausible_wrong(proposed, expected)),
                                          "checker": float(checker_right)},
                           details={"proposed": proposed, "final": final, "expected": expected})
