"""The `reasoning_gym` judge: the generator's own `score_answer` on the model's answer.

1. the reply: what the workflow handed the judge (`final_answer`), else the last assistant text;
2. the answer: the last `<answer>...</answer>` in it, taken out by reasoning-gym's own
   `reasoning_gym.utils.extract_answer` (as its evaluations do); a reply without the tag scores
   `score_answer(None, entry)` (0), unless `untagged: whole_reply` scores the whole reply instead;
3. the score: `score_answer(answer, entry)` of the task's generator, built with the task's config
   (reader.py stores both in `metadata.reasoning_gym`). Reward = score; success = score >= success_at.

The judge runs where `judge.isolation` says (a worker process by default), so `judge.timeout` and
`judge.memory_limit_mb` bound every `score_answer` call: a scorer that hangs or eats memory ends that
episode `judge_timeout` / `judge_memory`, and a scorer that raises ends it `judge_error`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import Judge, JudgeInput, JudgeResult
from agenttune_reasoning_gym.generators import import_modules, scorer
from agenttune_reasoning_gym.reader import METADATA_KEY


class NotAReasoningGymTask(ValueError):
    """The task was not made by the reasoning_gym reader: there is no entry to score against."""


class ReasoningGymJudgeOptions(BaseModel):
    """Options of the `reasoning_gym` judge."""

    model_config = ConfigDict(extra="forbid")

    answer_tag: str = Field(default="answer", description="The tag around the final answer: <answer>...</answer>.")
    untagged: Literal["zero", "whole_reply"] = Field(
        default="zero", description="A reply without the tag: zero scores score_answer(None) (reasoning-gym's "
                                    "way); whole_reply scores the whole reply as the answer.")
    success_at: float = Field(default=1.0, description="Score from which an episode counts as solved.")


class ReasoningGymJudge(Judge):
    """Scores the answer with the task's reasoning-gym generator (`score_answer`)."""

    name = "reasoning_gym"
    Options = ReasoningGymJudgeOptions

    def __init__(self, options: ReasoningGymJudgeOptions | None = None):
        super().__init__(options)
        self.options: ReasoningGymJudgeOptions
        # reasoning-gym takes seconds to import (every generator, sympy): import it here, which a judge worker
        # does before it reports ready, so that the first score_answer's judge.timeout is not spent on it.
        import reasoning_gym.utils  # noqa: F401

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        from reasoning_gym.utils import extract_answer

        stored = _stored(judge_input)
        handed = judge_input.final_answer
        reply = handed if isinstance(handed, str) else judge_input.last_assistant_text
        answer = extract_answer(reply, tag_name=self.options.answer_tag)
        tagged = answer is not None
        if not tagged and self.options.untagged == "whole_reply" and reply.strip():
            answer = reply.strip()
        import_modules(stored.get("imports", []), "task_reader")
        score_answer = scorer(stored["dataset"], json.dumps(stored.get("config", {}), sort_keys=True))
        score = float(score_answer(answer, stored["entry"]))
        return JudgeResult(reward=score, success=score >= self.options.success_at, details={
            "score": score,
            "format_ok": 1.0 if tagged else 0.0,
            "answer": _tail(answer) if answer is not None else None,
            "expected": stored["entry"].get("answer"),
            "dataset": stored["dataset"],
        })


def _stored(judge_input: JudgeInput) -> dict[str, Any]:
    stored = judge_input.task.metadata.get(METADATA_KEY)
    if not isinstance(stored, dict) or "entry" not in stored or "dataset" not in stored:
        raise NotAReasoningGymTask(
            f"task {judge_input.task.task_id!r} has no metadata.{METADATA_KEY} entry: the reasoning_gym judge scores "
            f"tasks of the reasoning_gym task reader (task_reader.type: reasoning_gym)")
    return stored


def _tail(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3):]
