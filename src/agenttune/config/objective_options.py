"""The `algorithm` options of the objective beyond its estimator and loss: dynamic sampling and
overlong reward shaping (DAPO, Yu et al., 2025). Low in the layers, like `rollout_correction.py`,
so that config/models.py and the backbones that read them share one definition."""

from __future__ import annotations

from pydantic import Field, model_validator

from agenttune.config.base import Section


class DynamicSamplingOptions(Section):
    """`algorithm.dynamic_sampling`: train only on groups with a learning signal, and keep the batch full."""

    enable: bool = Field(default=False, description="Replace groups without reward spread (the estimator's "
                         "`informative` test) by fresh ones until the step holds data.train_batch_size informative "
                         "groups (DAPO's dynamic sampling; verl's algorithm.filter_groups).")
    max_retries: int = Field(default=4, ge=0, description="Extra rollout rounds a step may run to fill its batch. When "
                             "they are spent the step trains on the informative groups it has (fewer than "
                             "train_batch_size; counted as train/dynamic_sampling_short) and never loops forever.")


class OverlongShapingOptions(Section):
    """`algorithm.overlong_shaping`: DAPO's soft overlong punishment of long responses."""

    enable: bool = Field(default=False, description="Subtract DAPO's length penalty from the reward of episodes "
                         "whose generated tokens come within `buffer` of `max_length`.")
    max_length: int = Field(default=1024, gt=0, description="L_max: the generated tokens at which the penalty is "
                            "`penalty` (and beyond which it stays so).")
    buffer: int = Field(default=256, gt=0, description="L_cache: the penalty grows linearly over the last `buffer` "
                        "tokens before `max_length`.")
    penalty: float = Field(default=1.0, ge=0, description="The largest penalty (verl's penalty_factor).")

    @model_validator(mode="after")
    def _buffer_fits(self) -> OverlongShapingOptions:
        if self.enable and self.buffer > self.max_length:
            raise ValueError(f"buffer ({self.buffer}) must not exceed max_length ({self.max_length})")
        return self

    def shaping(self, generated_tokens: int) -> float:
        """What to subtract from the reward of an episode that generated this many tokens (0 when off).

        Every backbone applies it to the same count, `Episode.generated_tokens`: the local one before
        its estimator, verl and Trinity to the reward the episode hands their trainer."""
        return self.penalty_for(generated_tokens) if self.enable else 0.0

    def penalty_for(self, generated_tokens: int) -> float:
        """DAPO's rule: 0 up to max_length - buffer, then linear to `penalty` at max_length, `penalty` beyond."""
        expected = self.max_length - self.buffer
        if generated_tokens <= expected:
            return 0.0
        return self.penalty * min(1.0, (generated_tokens - expected) / self.buffer)
