"""agenttune's rollout-correction maths against verl 0.9.1's own (`verl/trainer/ppo/rollout_corr_helper.py`).

The options carry verl's names so that a config means the same under `--backbone local` and
`--backbone verl`; here the local backbone's weights and rejection masks are compared with what
verl computes from the same random log-ratios.
"""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo.rollout_corr_helper import (
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)

from agenttune.plugin_api import importance_weights, rejection_mask


def random_batch(seed: int, rows: int = 8, tokens: int = 12, spread: float = 0.8):
    generator = torch.Generator().manual_seed(seed)
    log_ratio = torch.randn(rows, tokens, generator=generator, dtype=torch.float64) * spread
    lengths = torch.randint(1, tokens + 1, (rows,), generator=generator)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).to(torch.float64)
    return log_ratio, mask


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 1.3, "0.5_2.0", "0.8_1.25"])
@pytest.mark.parametrize("seed", range(4))
def test_importance_weights_equal_verls(level, threshold, seed):
    log_ratio, mask = random_batch(seed, spread=0.3 if level == "sequence" else 1.0)
    ours, _ = importance_weights(log_ratio, mask, level, threshold)
    theirs, _ = compute_rollout_correction_weights(log_ratio, mask, rollout_is=level, rollout_is_threshold=threshold)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("criteria", "threshold"), [
    ("token_k1", "0.5_2.0"), ("token_k1", 1.5), ("token_k2", 0.3), ("token_k3", 0.2), ("seq_sum_k1", "0.2_5.0"),
    ("seq_sum_k2", 2.0), ("seq_sum_k3", 1.0), ("seq_mean_k1", "0.7_1.4"), ("seq_mean_k2", 0.4),
    ("seq_mean_k3", 0.3), ("seq_max_k2", 1.0), ("seq_max_k3", 1.5), ("token_k2,seq_mean_k1", "0.3,0.7_1.4"),
])
@pytest.mark.parametrize("seed", range(4))
def test_rejection_masks_equal_verls(criteria, threshold, seed):
    log_ratio, mask = random_batch(seed)
    ours, stats = rejection_mask(log_ratio, mask, criteria, threshold)
    theirs, metrics = compute_rollout_rejection_mask(log_ratio, mask, rollout_rs=criteria,
                                                     rollout_rs_threshold=threshold)
    assert torch.equal(ours, theirs.to(ours.dtype))
    assert stats["rs_rejected_tokens"] / mask.sum().item() == pytest.approx(metrics["rollout_rs_masked_fraction"])
