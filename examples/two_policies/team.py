"""The two-policy example's workflow: a solver and a checker on the quickstart's arithmetic.

- `solver` gets the problem and the calculator, and must answer ("The answer is 9716.").
- `checker` gets the problem, the solver's proposed answer and the calculator, and must give the
  answer it vouches for: the proposal when it is right, the correct value when it is not. Copying the
  number in its prompt is what a warmed-up model does by default; the checker has to learn when not to.

Each agent talks to its own client, named as an AgentScope agent would be (`agent="solver"`); the
YAML's `policies.agents` maps those names to policies. The team is judged on both answers.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The quickstart's task, calculator and agent loop, shared rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "quickstart"))

from arithmetic import SYSTEM_PROMPT, parse_final_answer  # noqa: E402
from calculator_agent import converse  # noqa: E402

from agenttune import Judge, JudgeInput, JudgeResult, Workflow, WorkflowOutput  # noqa: E402

CHECKER_PROMPT = "Check the proposed answer to the arithmetic problem. You may use the calculator."


def checker_question(query: str, proposed: int | None) -> str:
    proposal = "no answer" if proposed is None else f"The answer is {proposed}."
    return f"{query} Proposed: {proposal}"


class SolverAndChecker(Workflow):
    async def execute(self, task, tuner) -> WorkflowOutput:
        solved = await converse(tuner.as_async_openai_client(agent="solver"),
                                [{"role": "system", "content": SYSTEM_PROMPT},
                                 {"role": "user", "content": task.query}])
        proposed = parse_final_answer(solved)
        checked = await converse(tuner.as_async_openai_client(agent="checker"),
                                 [{"role": "system", "content": CHECKER_PROMPT},
                                  {"role": "user", "content": checker_question(task.query, proposed)}])
        final = parse_final_answer(checked)
        tuner.update_judge_input_dictionary(final_answer=final)
        return WorkflowOutput(metadata={"final_answer": final, "proposed_answer": proposed})


class TeamJudge(Judge):
    """Reward: the share of the two answers that are right (0, 0.5 or 1), one team reward for both agents.
    Success (the held-out accuracy): the checker's answer, the team's final one, is right."""

    name = "team_arithmetic"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        expected = int(judge_input.task.ground_truth)
        proposed = judge_input.output.metadata.get("proposed_answer")
        final = judge_input.final_answer
        solver_right, checker_right = proposed == expected, final is not None and int(final) == expected
        return JudgeResult(reward=(solver_right + checker_right) / 2, success=checker_right,
                           details={"proposed": proposed, "final": final, "expected": expected})
