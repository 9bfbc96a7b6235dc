"""`algorithm.rollout_correction`: how a trainer corrects for tokens sampled off-policy (verl's names).

The options only; the local backbone's tensor maths is in backbones/local/rollout_correction.py,
and the verl plugin passes the same section to verl's `algorithm.rollout_correction` unchanged.
No torch here: the config loads without it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


class RolloutCorrectionOptions(BaseModel):
    """`algorithm.rollout_correction`: verl 0.9.1's names; everything off by default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    rollout_is: Literal["token", "sequence"] | None = Field(
        default=None, description="Importance weights pi_old / pi_rollout per token or per sequence; null: none.")
    rollout_is_threshold: float | str = Field(
        default=2.0, description="One number: truncate weights above it (TIS). 'lower_upper' (e.g. '0.5_2.0'): "
                                 "weights outside the bounds become 0 (masked IS / IcePop).")
    rollout_is_batch_normalize: bool = Field(
        default=False, description="Scale the step's importance weights to mean 1.")
    rollout_rs: str | None = Field(
        default=None, description="Rejection sampling: comma-separated criteria, each one of "
                                  f"{', '.join(RS_OPTIONS)}; a token (token_*) or sequence (seq_*) outside "
                                  "its bound is left out of the loss. null: none.")
    rollout_rs_threshold: float | str | None = Field(
        default=None, description="Bounds for rollout_rs, one per criterion or one for all (comma-separated). "
                                  "k1 criteria take 'lower_upper' ratio bounds (one number u means 1/u_u); "
                                  "k2/k3 take an upper bound.")
    bypass_mode: bool = Field(
        default=False, description="Use the engine's logprobs as the old policy (no scoring pass before the "
                                   "update); loss_type picks the objective.")
    loss_type: Literal["ppo_clip", "reinforce"] = Field(
        default="ppo_clip", description="With bypass_mode: PPO's clipped ratio against the engine's logprobs, "
                                        "or REINFORCE with the rollout_is weights.")

    @field_validator("rollout_is_threshold")
    @classmethod
    def _threshold_parses(cls, value: float | str) -> float | str:
        is_bounds(value)
        return value

    @field_validator("rollout_rs")
    @classmethod
    def _known_criteria(cls, value: str | None) -> str | None:
        if value is not None:
            unknown = [name for name in rs_criteria(value) if name not in RS_OPTIONS]
            if unknown or not rs_criteria(value):
                raise ValueError(f"unknown rejection criteria {unknown or value!r}; use a comma-separated list "
                                 f"of {', '.join(RS_OPTIONS)}")
        return value

    @model_validator(mode="after")
    def _rs_has_bounds(self) -> RolloutCorrectionOptions:
        if self.rollout_rs is not None:
            rs_bounds(rs_criteria(self.rollout_rs), self.rollout_rs_threshold)
        if self.bypass_mode and self.loss_type == "reinforce" and self.rollout_is is None:
            raise ValueError("loss_type 'reinforce' weighs tokens by rollout_is: set rollout_is to token or sequence")
        if self.bypass_mode and self.rollout_is_batch_normalize:
            # Bypass weights are measured against the current policy micro-batch by micro-batch.
            raise ValueError("rollout_is_batch_normalize needs the scoring pass of decoupled mode: set "
                             "bypass_mode to false, or rollout_is_batch_normalize to false")
        return self

    @property
    def enabled(self) -> bool:
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode


# -- thresholds -------------------------------------------------------------------------------------
def is_bounds(threshold: float | str) -> tuple[float | None, float]:
    """(lower, upper) of `rollout_is_threshold`; lower is None for plain truncation."""
    if isinstance(threshold, bool):
        raise ValueError("rollout_is_threshold must be a number or a 'lower_upper' string, not a boolean")
    lower, upper = _split_bounds(threshold, "rollout_is_threshold")
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold {threshold!r}: bounds must be positive with lower <= upper")
    return lower, upper


def rs_criteria(spec: str) -> list[str]:
    names: list[str] = []
    for name in (part.strip() for part in spec.split(",")):
        if name and name not in names:
            names.append(name)
    return names


def rs_bounds(criteria: list[str], threshold: float | str | None) -> dict[str, tuple[float | None, float]]:
    """Each criterion's (lower, upper): ratio bounds for k1 criteria, an upper bound for k2/k3."""
    if threshold is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold (the bound of each criterion)")
    specs = [part.strip() for part in str(threshold).split(",") if part.strip()]
    if len(specs) not in (1, len(criteria)):
        raise ValueError(f"rollout_rs_threshold has {len(specs)} bounds for {len(criteria)} criteria: give one "
                         "for all or one per criterion")
    specs = specs * len(criteria) if len(specs) == 1 else specs
    bounds: dict[str, tuple[float | None, float]] = {}
    for name, spec in zip(criteria, specs, strict=True):
        lower, upper = _split_bounds(spec, f"rollout_rs_threshold for {name}")
        if name.endswith("k1"):
            lower = 1.0 / upper if lower is None else lower
            if not 0 < lower <= upper:
                raise ValueError(f"rollout_rs_threshold for {name}: ratio bounds must be positive with lower <= upper")
        elif lower is not None or upper <= 0:
            raise ValueError(f"rollout_rs_threshold for {name}: give one positive upper bound, not {spec!r}")
        bounds[name] = (lower, upper)
    return bounds


def _split_bounds(spec: float | str, key: str) -> tuple[float | None, float]:
    text = str(spec).strip()
    try:
        if "_" in text:
            lower, upper = text.split("_", 1)
            return float(lower), float(upper)
        return None, float(text)
    except ValueError:
        raise ValueError(f"{key} {spec!r} is neither a number nor 'lower_upper'") from None


