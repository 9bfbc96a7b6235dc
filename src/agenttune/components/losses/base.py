"""The policy-loss contract: per-token losses from the policy's log-probs and the advantages.

A loss sees one micro-batch as a `LossInput` of [rows, tokens] tensors and returns a per-token loss
(and where clipping acted); the trainer masks and averages it (`algorithm.loss_agg_mode`), adds the
KL penalty and applies rollout correction weights. torch is imported by the built-ins inside their
methods and named here only for type checkers, so listing plugins does not import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel

from agenttune.config.base import Component

if TYPE_CHECKING:
    import torch

# How per-token losses become one number (`algorithm.loss_agg_mode`; backbones/local/loss.py's aggregate).
LossAggregation = Literal["token-mean", "seq-mean-token-mean"]


@dataclass
class LossInput:
    """One micro-batch as a loss sees it."""

    logprobs: torch.Tensor  # [rows, tokens], with gradient: the policy being trained
    old_logprobs: torch.Tensor  # [rows, tokens], no gradient: π_old (the policy that sampled, or its recomputation)
    advantages: torch.Tensor  # [rows]: one advantage per row, broadcast over its tokens
    mask: torch.Tensor  # [rows, tokens], 1.0 on trained tokens
    clip_low: float  # algorithm.clip_ratio_low
    clip_high: float  # algorithm.clip_ratio_high
    teacher_logprobs: torch.Tensor | None = None  # [rows, tokens]: a teacher's log-probs of the sampled tokens


@dataclass
class LossOutput:
    per_token: torch.Tensor  # [rows, tokens]; the trainer masks and aggregates it
    clipped: torch.Tensor  # [rows, tokens], 1.0 where clipping changed the token's loss (a metric)


class PolicyLoss(Component):
    """A policy-gradient loss, selected by `algorithm.policy_loss` (`name`); its `Options` are the keys
    of `algorithm.policy_loss_options`. `loss_agg_mode`, when set, is the aggregation the loss is
    defined with (GSPO's sequence mean) and overrides `algorithm.loss_agg_mode`. A loss that sets
    `needs_teacher` has the options backbones/local/teacher.py reads (`teacher`, `teacher_engine`,
    `teacher_engine_options`, `teacher_base_url`, `teacher_api_key`) and gets the teacher's log-probs."""

    loss_agg_mode: ClassVar[LossAggregation | None] = None
    # True: the trainer scores every batch with the teacher model named by the options' `teacher`
    # and hands its log-probs in `LossInput.teacher_logprobs` (on-policy distillation).
    needs_teacher: ClassVar[bool] = False

    def __init__(self, options: BaseModel | None = None):
        self.options = options if options is not None else self.Options()

    def __call__(self, batch: LossInput) -> LossOutput:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(batch)")
