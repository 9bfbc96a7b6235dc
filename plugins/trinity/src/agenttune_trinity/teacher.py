"""The distillation teacher's log-probs on the Experiences of one task, for Trinity's on-policy distillation.

Trinity-RFT 0.6.0's `on_policy_distill` advantage reads `Experience.teacher_logprobs` (the teacher's
log-prob of each response token) and its own `OnPolicyDistillWorkflow` fills them from the first
auxiliary model. agenttune's workflow does the same with the teacher the translation configures as
`explorer.auxiliary_models[0]` (a vLLM engine Trinity serves on its own GPU): the whole sequence,
prompt and response, is scored in one call at `rollout.temperature` (what agenttune's `hf` teacher
does on the local backbone), and the response's part is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agenttune.plugin_api import UserError


def the_teacher(auxiliary_models: Sequence[Any] | None) -> Any:
    if not auxiliary_models:
        raise UserError("algorithm.policy_loss: distillation on the trinity backbone needs the teacher as Trinity's "
                        "first auxiliary model, and this workflow runner was given none.",
                        hint="Let the trinity backbone write explorer.auxiliary_models (from policy_loss_options."
                             "teacher); do not replace trinity.explorer.auxiliary_models.")
    return auxiliary_models[0]


async def score_with_teacher(experiences: Sequence[Any], teacher: Any, *, temperature: float) -> None:
    """Set each Experience's `teacher_logprobs` from `teacher` (a Trinity `ModelWrapper`)."""
    scores = await asyncio.gather(*(teacher.logprobs_async(tokens=experience.tokens.tolist(), temperature=temperature)
                                    for experience in experiences))
    for experience, logprobs in zip(experiences, scores, strict=True):
        # logprobs[i] is the teacher's log-prob of token i + 1: the response starts at prompt_length - 1
        response = logprobs[experience.prompt_length - 1:]
        expected = len(experience.tokens) - experience.prompt_length
        if len(response) != expected:
            raise RuntimeError(f"the distillation teacher scored {len(response)} response tokens, not {expected}: "
                               "it must return one log-prob per token after the first (vLLM's prompt_logprobs)")
        experience.teacher_logprobs = response
