"""The judge of the trinity plugin's tests (loaded by reference, like a user's module).

The agent it scores is `agenttune.testing.agents:CalculatorWorkflow`, a multi-turn tool agent.
"""

from __future__ import annotations

from agenttune import Judge, JudgeInput, JudgeResult


class ExactAnswerJudge(Judge):
    """Reward 1 when the final answer ends with the task's answer."""

    name = "exact_answer"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = (judge_input.final_answer or "").strip().rstrip(".")
        expected = str(judge_input.task.metadata["answer"])
        solved = answer.endswith(expected)
        return JudgeResult(reward=1.0 if solved else 0.0, success=solved)


class AnswerLengthJudge(Judge):
    """A reward that differs between the episodes of a group (the untrained model never solves a task):
    how long the final answer is, in steps of 1/6. GRPO then has advantages to train on."""

    name = "answer_length"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        return JudgeResult(reward=(len(judge_input.final_answer or "") % 7) / 6, success=False)
