"""A custom judge: the answer is right when it contains the expected words (case-insensitive)."""

from __future__ import annotations

from agenttune import Judge, JudgeInput, JudgeResult


class ContainsAnswerJudge(Judge):
    name = "contains_answer"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = str(judge_input.final_answer or "").lower()
        expected = str(judge_input.task.ground_truth).lower()
        solved = bool(expected) and expected in answer
        return JudgeResult(reward=1.0 if solved else 0.0, success=solved,
                           details={"expected": expected, "answer": answer[:200]})
