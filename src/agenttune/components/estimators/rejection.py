"""Rejection-sampling fine-tuning (RFT, RAFT): imitate the episodes whose reward passes a threshold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.components.estimators.base import AdvantageEstimator, Advantages, Groups, Scored


class RejectionSamplingOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(default=1.0, description="Episodes whose reward is at least this are trained on; the "
                                                        "others are not trained at all.")


class RejectionSamplingEstimator(AdvantageEstimator):
    """Weight 1 for every episode whose reward reaches `threshold`, none for the others: with the
    `cross_entropy` loss this is supervised fine-tuning on the policy's own good episodes (the
    generated tokens only). Needs no group: `num_repeat: 1` works."""

    name = "rejection_sampling"
    Options: ClassVar[type[BaseModel]] = RejectionSamplingOptions
    min_group_size = 1

    def estimate(self, groups: Groups) -> Advantages:
        threshold = self.options.threshold  # type: ignore[attr-defined]
        return Advantages({member.episode_id: 1.0 for members in groups.values() for member in members
                           if member.reward >= threshold})

    def informative(self, group: Sequence[Scored]) -> bool:
        return any(member.reward >= self.options.threshold for member in group)  # type: ignore[attr-defined]
