"""Rollout correction: importance weights and rejection masks for tokens the engine sampled off-policy.

The engine that sampled a token (its behaviour policy, `π_rollout`, whose logprobs the sample
carries) is never exactly the policy the trainer scores (`π_old`): bf16 against fp32, a vLLM
kernel against a torch one, or — with asynchronous training — older weights. The option names
and their meaning follow verl 0.9.1's `algorithm.rollout_correction` (`RolloutCorrectionConfig`
and `trainer/ppo/rollout_corr_helper.py`), so a config moves between the local backbone and verl
unchanged:

- `rollout_is` — importance weights `π_old / π_rollout`, per `token` or per `sequence` (product
  over the sequence's trained tokens), multiplied into the policy loss. `rollout_is_threshold`
  is either one number (truncated IS: weights above it are clamped to it) or `"lower_upper"`
  (masked IS, IcePop: weights outside [lower, upper] become 0).
- `rollout_rs` — rejection: tokens or whole sequences whose divergence estimate (`k1 = -log r`,
  `k2 = (log r)² / 2`, `k3 = r - 1 - log r`, per token or as a sequence sum, mean or max) leaves
  its bound are dropped from the loss. `seq_mean_k1` bounds the sequence's geometric-mean ratio.
- `bypass_mode` — use the engine's logprobs as `π_old` (no extra scoring pass); `loss_type`
  then picks PPO's clipped ratio (`ppo_clip`, the ratio itself is the correction) or REINFORCE
  with explicit truncated weights (`reinforce`).

Everything here is a pure function of per-token tensors of shape [rows, tokens] and a 0/1 mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from agenttune.config.correction_options import RolloutCorrectionOptions, is_bounds, rs_bounds, rs_criteria

# exp(±20) bounds every exponent, as verl does: weights stay finite on outliers.
SAFETY_BOUND = 20.0


# -- the correction ---------------------------------------------------------------------------------
@dataclass
class Correction:
    """What the loss needs: weights (None: unweighted) and the loss mask after rejection."""

    weights: torch.Tensor | None
    mask: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)  # sums and counts, added up over micro-batches


def importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str,
                       threshold: float | str) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated (or masked) importance weights, detached, 0 off the mask; and their sums for metrics."""
    lower, upper = is_bounds(threshold)
    mask = mask.to(log_ratio.dtype)
    if level == "token":
        log_weight = log_ratio
    elif level == "sequence":
        log_weight = (log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is must be token or sequence, not {level!r}")
    raw = torch.exp(log_weight.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
    if lower is None:
        weights, cut = raw.clamp(max=upper), (raw > upper)
    else:
        cut = (raw < lower) | (raw > upper)
        weights = torch.where(cut, torch.zeros_like(raw), raw)
    on = mask.bool()
    stats = {"is_weight_sum": float(weights[on].sum()), "is_weight_max": float(weights[on].max()) if on.any() else 0.0,
             "is_raw_weight_max": float(raw[on].max()) if on.any() else 0.0,
             ("is_masked_tokens" if lower is not None else "is_truncated_tokens"): float((cut & on).sum())}
    return weights.detach(), stats


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, spec: str,
                   threshold: float | str | None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss mask with rejected tokens (or whole sequences) set to 0; all criteria must pass."""
    criteria = rs_criteria(spec)
    bounds = rs_bounds(criteria, threshold)
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    divergence = {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}
    on = mask.bool()
    keep = torch.ones_like(on)
    for name in criteria:
        lower, upper = bounds[name]
        level, estimator = name.rsplit("_", 1)
        values = divergence[estimator]
        statistic = values if level == "token" else _per_sequence(values, on, level).unsqueeze(-1)
        if estimator == "k1":  # -log r within [log lower, log upper], as verl compares it
            assert lower is not None
            passed = (statistic >= math.log(lower)) & (statistic <= math.log(upper))
        else:
            passed = statistic <= upper
        keep &= passed.expand_as(on)
    kept = on & keep
    rejected_rows = (on & ~keep).any(-1)
    stats = {"rs_rejected_tokens": float((on & ~keep).sum()), "rs_rejected_sequences": float(rejected_rows.sum())}
    return kept.to(mask.dtype), stats


def _per_sequence(values: torch.Tensor, on: torch.Tensor, level: str) -> torch.Tensor:
    if level == "seq_sum":
        return (values * on).sum(-1)
    if level == "seq_mean":
        return (values * on).sum(-1) / on.sum(-1).clamp(min=1)
    if level == "seq_max":
        best = values.masked_fill(~on, float("-inf")).max(-1).values
        return torch.where(torch.isinf(best), torch.zeros_like(best), best)
    raise ValueError(f"unknown rejection level {level!r}")


def correct(log_ratio: torch.Tensor, mask: torch.Tensor, options: RolloutCorrectionOptions, *,
            with_weights: bool = True) -> Correction:
    """Rejection first (it shrinks the mask), then importance weights on what is kept.

    `log_ratio` is log(π_old / π_rollout) per token. `with_weights=False` (bypass + ppo_clip: the
    ratio to the engine's logprobs is the correction) computes the mask only.
    """
    stats: dict[str, float] = {"rows": float(mask.shape[0]), "tokens": float(mask.sum())}
    stats.update(_mismatch(log_ratio, mask))
    kept = mask
    if options.rollout_rs is not None:
        kept, rejected = rejection_mask(log_ratio, mask, options.rollout_rs, options.rollout_rs_threshold)
        stats.update(rejected)
    weights = None
    if with_weights and options.rollout_is is not None:
        weights, weighed = importance_weights(log_ratio, kept, options.rollout_is, options.rollout_is_threshold)
        stats.update(weighed, is_tokens=float(kept.sum()))
    return Correction(weights, kept, stats)


def _mismatch(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """KL(π_rollout || π_old) estimated on the sampled tokens: k1 = -log r, k3 = r - 1 - log r."""
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND) * mask
    return {"kl_k1_sum": float((-safe).sum()), "kl_k3_sum": float(((torch.exp(safe) - 1.0 - safe) * mask).sum())}


def normalize(corrections: list[Correction], level: str | None) -> float:
    """Scale every weight so the step's mean weight is 1 (per token, or per sequence); returns the factor."""
    present = [(c, c.weights) for c in corrections if c.weights is not None]
    if not present or level is None:
        return 1.0
    if level == "token":
        total = sum(float((weights * c.mask).sum()) for c, weights in present)
        count = sum(float(c.mask.sum()) for c, _ in present)
    else:
        rows = [(weights * c.mask).sum(-1) / c.mask.sum(-1).clamp(min=1) for c, weights in present]
        valid = [c.mask.sum(-1) > 0 for c, _ in present]
        total = sum(float(r[v].sum()) for r, v in zip(rows, valid, strict=True))
        count = sum(float(v.sum()) for v in valid)
    mean = total / count if count else 0.0
    if mean > 1e-8:
        for correction, weights in present:
            correction.weights = weights / mean
        return mean
    return 1.0


def metrics(totals: dict[str, float]) -> dict[str, float]:
    """`train/rollout_*` metrics from the summed stats of a step's corrections."""
    tokens = max(totals.get("tokens", 0.0), 1.0)
    result = {
        "train/rollout_kl_k1": totals.get("kl_k1_sum", 0.0) / tokens,
        "train/rollout_kl_k3": totals.get("kl_k3_sum", 0.0) / tokens,
    }
    if "is_tokens" in totals:
        weighed = max(totals["is_tokens"], 1.0)
        result["train/rollout_is_mean"] = totals.get("is_weight_sum", 0.0) / weighed
        result["train/rollout_is_max"] = totals.get("is_weight_max", 0.0)
        result["train/rollout_is_raw_max"] = totals.get("is_raw_weight_max", 0.0)
        if "is_truncated_tokens" in totals:
            result["train/rollout_is_truncated_fraction"] = totals["is_truncated_tokens"] / weighed
        if "is_masked_tokens" in totals:
            result["train/rollout_is_masked_fraction"] = totals["is_masked_tokens"] / weighed
    if "rs_rejected_tokens" in totals:
        result["train/rollout_rs_masked_fraction"] = totals["rs_rejected_tokens"] / tokens
        result["train/rollout_rs_seq_masked_fraction"] = totals["rs_rejected_sequences"] / max(totals["rows"], 1.0)
    return result
