"""The math judges: `math` (alias `gsm8k`) and `math_and_llm`.

`math` compares the episode's final answer with the task's ground truth:

1. the answer: what the workflow handed the judge (`final_answer`), else the last assistant text;
2. the ground truth: `metadata.ground_truth`, else the number after `####` in GSM8K's `answer`;
3. math-verify decides (gold first), in a worker process under `verify_timeout`, on the last
   marked answer (`\\boxed{}`, else `#### N`) when there is one, else on the whole text;
4. when it cannot (timed out, parsed nothing), the marked answer is compared as a number.

`details.format_ok` (1.0 or 0.0) says whether the answer came in the expected form.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import Judge, JudgeInput, JudgeResult, LLMJudge, LLMJudgeOptions
from agenttune_gsm8k.answers import answer_text, ground_truth, same_answer, strict_answer
from agenttune_gsm8k.verifier import MathVerifier


class MissingGroundTruth(ValueError):
    """The task carries no reference answer to compare with."""


class MathJudgeOptions(BaseModel):
    """Options of the `math` / `gsm8k` judge."""

    model_config = ConfigDict(extra="forbid")

    ground_truth_key: str | None = Field(
        default=None,
        description="Task metadata key of the reference answer. Default: ground_truth, else the part of "
                    "answer after '####' (GSM8K).")
    answer_format: Literal["boxed", "hash", "either"] = Field(
        default="either", description="The form a compliant answer takes: \\boxed{N}, '#### N', or either.")
    require_format: bool = Field(
        default=False, description="Count a right answer as wrong when it is not in answer_format.")
    correct_reward: float = Field(default=1.0, description="Reward for a right answer.")
    wrong_reward: float = Field(default=0.0, description="Reward for a wrong (or missing) answer.")
    format_reward: float = Field(default=0.0, description="Added to the reward when the format complies.")
    use_math_verify: bool = Field(default=True, description="Compare with math-verify; false: strict only.")
    verify_timeout: float = Field(default=5.0, gt=0, description="Seconds math-verify may spend on one answer.")
    verify_workers: int = Field(default=2, gt=0, description="math-verify worker processes (comparisons at once).")
    verify_memory_mb: int = Field(default=1024, gt=0, description="Memory (MB) a math-verify worker may add for one "
                                                                  "comparison; past it the verdict is undecided.")


class MathJudge(Judge):
    """Checks a math answer against the ground truth; reward, success and a format metric."""

    name = "math"
    isolation = "loop"  # math-verify runs in its own worker processes, under their limits
    Options = MathJudgeOptions

    def __init__(self, options: MathJudgeOptions | None = None):
        super().__init__(options)
        self.options: MathJudgeOptions
        self.verifier = (MathVerifier(self.options.verify_timeout, self.options.verify_workers,
                                      memory_mb=self.options.verify_memory_mb)
                         if self.options.use_math_verify else None)

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        gold = ground_truth(judge_input.task.metadata, self.options.ground_truth_key)
        if gold is None:
            wanted = self.options.ground_truth_key or "ground_truth (or a GSM8K answer with '####')"
            raise MissingGroundTruth(
                f"task {judge_input.task.task_id!r} has no reference answer: its metadata has no {wanted}. "
                f"Set task_reader.ground_truth_column, or judge.ground_truth_key to the metadata key.")
        handed = judge_input.final_answer
        text = answer_text(handed) if handed is not None else judge_input.last_assistant_text
        marked, form = strict_answer(text)
        correct, method, note = self._decide(gold, text, marked, form)
        format_ok = form is not None and self.options.answer_format in (form, "either")
        if self.options.require_format and not format_ok:
            correct = False
        reward = self.options.correct_reward if correct else self.options.wrong_reward
        if format_ok:
            reward += self.options.format_reward
        return JudgeResult(reward=reward, success=correct, details={
            "correct": correct,
            "format_ok": 1.0 if format_ok else 0.0,
            "answer_format": form or "none",
            "method": method,
            "ground_truth": gold,
            "answer": marked if marked is not None else _tail(text),
            **({"verify_note": note} if note else {}),
        })

    def _decide(self, gold: str, text: str, marked: str | None, form: str | None) -> tuple[bool, str, str]:
        """(correct, which check decided, why math-verify did not) for one answer text.

        A marked answer is what counts, so math-verify sees only the last one: given the whole text
        it would read `\\boxed{70} ... \\boxed{72}` as the set {70, 72}. Unmarked text goes in whole
        and math-verify finds the answer in it ("so the answer is 72").
        """
        note = ""
        if self.verifier is not None and text.strip():
            target = {"boxed": f"\\boxed{{{marked}}}", "hash": f"#### {marked}"}.get(form or "", text)
            verdict = self.verifier.compare(gold, target)
            if verdict.equal is not None:
                return verdict.equal, "math_verify", ""
            note = verdict.reason
        if marked is None:
            return False, "strict", note or "no \\boxed{} or '####' answer"
        return same_answer(gold, marked), "strict", note

    async def aclose(self) -> None:
        if self.verifier is not None:
            self.verifier.close()


class GSM8KJudge(MathJudge):
    """The `math` judge under the name the GSM8K recipes use."""

    name = "gsm8k"


REASONING_TEMPLATE = """\
A student solved the math problem below. The final answer has already been checked by a program \
({{ metadata.math_verdict }}); you grade only the reasoning.

## Problem
{{ query }}

## Reference answer
{{ reference }}

## Student's solution
{{ transcript }}

Is the reasoning correct, complete and free of lucky guesses? Write at most three sentences, then \
end with one line "Score: N", N an integer from {{ min_score }} (no valid reasoning) to {{ max_score }} \
(fully sound reasoning).
"""



class ReasoningJudgeOptions(LLMJudgeOptions):
    """The LLM judge's options inside `math_and_llm`; its rubric grades the reasoning."""

    template: str = Field(default=REASONING_TEMPLATE, description="Jinja template of the reasoning rubric.")


class MathAndLLMOptions(MathJudgeOptions):
    """Options of `math_and_llm`: the math judge's, the weights, and the LLM judge's under `llm`."""

    math_weight: float = Field(default=0.5, ge=0, description="Weight of the math check's reward.")
    llm_weight: float = Field(default=0.5, ge=0, description="Weight of the LLM judge's reward (0..1).")
    llm: ReasoningJudgeOptions = Field(
        default_factory=ReasoningJudgeOptions,
        description="Options of the LLM judge (base_url, model, template, on_failure, ...), as for llm_judge.")


class MathAndLLMJudge(Judge):
    """The math check combined with an LLM judge's view of the reasoning (ASTune's MathAnswerAndLlmAsJudge).

    reward = math_weight * math reward + llm_weight * LLM reward (normalised to 0..1). Success is
    the math check's. When the LLM judge fails, its `on_failure` applies: `exclude` fails the
    judgement (status judge_error), `reward` uses its `failure_reward` for the LLM part.
    """

    name = "math_and_llm"
    isolation = "loop"  # awaits the LLM judge; math-verify runs in its own workers
    Options = MathAndLLMOptions

    def __init__(self, options: MathAndLLMOptions | None = None):
        super().__init__(options)
        self.options: MathAndLLMOptions
        math_fields = set(MathJudgeOptions.model_fields)
        self.math = MathJudge(MathJudgeOptions(**self.options.model_dump(include=math_fields)))
        self.llm = LLMJudge(self.options.llm)

    async def judge(self, judge_input: JudgeInput) -> JudgeResult:
        math_result = await asyncio.to_thread(self.math.judge, judge_input)
        verdict = "the final answer is right" if math_result.success else "the final answer is wrong"
        task = judge_input.task.model_copy(update={"metadata": {**judge_input.task.metadata, "math_verdict": verdict}})
        llm_result = await self.llm.judge(judge_input.model_copy(update={"task": task}))
        reward = self.options.math_weight * math_result.reward + self.options.llm_weight * llm_result.reward
        details = {**math_result.details, **llm_result.details,
                   "math_reward": math_result.reward, "llm_reward": llm_result.reward}
        return JudgeResult(reward=reward, success=math_result.success, details=details)

    async def aclose(self) -> None:
        await self.math.aclose()
        await self.llm.aclose()


def _tail(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3):]
