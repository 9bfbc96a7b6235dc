"""Rollout correction (issue 22): importance weights and rejection masks against an independent computation.

The reference below works on plain Python lists with `math`, one row at a time, written from verl
0.9.1's documented definitions (not from agenttune's tensor code). The verl plugin's tests compare
the same functions with verl's own `rollout_corr_helper` where verl is installed.
"""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from agenttune.config.correction_options import RolloutCorrectionOptions
from agenttune.config.models import AgentTuneConfig

torch = pytest.importorskip("torch")

from agenttune.backbones.local.rollout_correction import (  # noqa: E402
    correct,
    importance_weights,
    normalize,
    rejection_mask,  # noqa: E402
)

BOUND = 20.0


def random_batch(seed: int, rows: int = 6, tokens: int = 9, spread: float = 1.5):
    rng = random.Random(seed)
    log_ratio = [[rng.gauss(0.0, spread) for _ in range(tokens)] for _ in range(rows)]
    mask = []
    for _ in range(rows):
        start, length = rng.randint(0, 3), rng.randint(1, tokens - 3)
        mask.append([1 if start <= t < start + length else 0 for t in range(tokens)])
    return log_ratio, mask


def tensors(log_ratio, mask):
    return torch.tensor(log_ratio, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64)


def clamp(x: float) -> float:
    return min(max(x, -BOUND), BOUND)


# -- the independent reference ----------------------------------------------------------------------
def reference_weights(log_ratio, mask, level, lower, upper):
    weights = []
    for row, row_mask in zip(log_ratio, mask, strict=True):
        sequence = clamp(sum(r for r, m in zip(row, row_mask, strict=True) if m))
        out = []
        for r, m in zip(row, row_mask, strict=True):
            if not m:
                out.append(0.0)
                continue
            raw = math.exp(clamp(r) if level == "token" else sequence)
            if lower is None:
                out.append(min(raw, upper))
            else:
                out.append(raw if lower <= raw <= upper else 0.0)
        weights.append(out)
    return weights


def reference_keep(log_ratio, mask, criterion, lower, upper):
    level, estimator = criterion.rsplit("_", 1)
    keep = []
    for row, row_mask in zip(log_ratio, mask, strict=True):
        values = []
        for r in row:
            r = clamp(r)
            values.append({"k1": -r, "k2": 0.5 * r * r, "k3": math.exp(r) - 1.0 - r}[estimator])
        trained = [v for v, m in zip(values, row_mask, strict=True) if m]

        def passes(value):
            if estimator == "k1":
                return math.log(lower) <= value <= math.log(upper)
            return value <= upper

        if level == "token":
            keep.append([int(bool(m) and passes(v)) for v, m in zip(values, row_mask, strict=True)])
            continue
        statistic = {"seq_sum": sum(trained), "seq_mean": sum(trained) / max(len(trained), 1),
                     "seq_max": max(trained) if trained else 0.0}[level]
        keep.append([int(bool(m) and passes(statistic)) for m in row_mask])
    return keep


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold,lower,upper", [(2.0, None, 2.0), (1.2, None, 1.2), ("0.5_2.0", 0.5, 2.0)])
@pytest.mark.parametrize("seed", range(5))
def test_importance_weights_equal_an_independent_computation(level, threshold, lower, upper, seed):
    log_ratio, mask = random_batch(seed, spread=0.4 if level == "sequence" else 1.5)
    weights, stats = importance_weights(*tensors(log_ratio, mask), level, threshold)
    expected = reference_weights(log_ratio, mask, level, lower, upper)
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert not weights.requires_grad
    on = [w for row, m in zip(expected, mask, strict=True) for w, k in zip(row, m, strict=True) if k]
    assert stats["is_weight_sum"] == pytest.approx(sum(on)) and stats["is_weight_max"] == pytest.approx(max(on))
    # The counted cuts are the tokens whose raw weight left the bounds; the test data must have some.
    raw = reference_weights(log_ratio, mask, level, None, math.inf)
    cut = sum(1 for row, m in zip(raw, mask, strict=True) for w, k in zip(row, m, strict=True)
              if k and (w > upper or (lower is not None and w < lower)))
    assert stats["is_masked_tokens" if lower else "is_truncated_tokens"] == cut
    if seed == 0:
        assert cut > 0


RS_CASES = [("token_k1", "0.5_2.0", 0.5, 2.0), ("token_k1", 1.5, 1 / 1.5, 1.5), ("token_k2", 0.3, None, 0.3),
            ("token_k3", 0.2, None, 0.2), ("seq_sum_k1", "0.2_5.0", 0.2, 5.0), ("seq_sum_k3", 1.0, None, 1.0),
            ("seq_mean_k1", "0.7_1.4", 0.7, 1.4), ("seq_mean_k2", 0.4, None, 0.4),
            ("seq_max_k2", 1.0, None, 1.0), ("seq_max_k3", 1.5, None, 1.5)]


@pytest.mark.parametrize("criterion,threshold,lower,upper", RS_CASES)
@pytest.mark.parametrize("seed", range(4))
def test_rejection_masks_equal_an_independent_computation(criterion, threshold, lower, upper, seed):
    log_ratio, mask = random_batch(seed, spread=0.8)
    kept, stats = rejection_mask(*tensors(log_ratio, mask), criterion, threshold)
    expected = reference_keep(log_ratio, mask, criterion, lower, upper)
    assert kept.tolist() == [[float(k) for k in row] for row in expected]
    rejected = sum(m - k for row, row_mask in zip(expected, mask, strict=True) for k, m in zip(row, row_mask,
                                                                                                strict=True))
    assert stats["rs_rejected_tokens"] == rejected


def test_several_criteria_must_all_pass():
    log_ratio, mask = random_batch(7, spread=0.8)
    kept, _ = rejection_mask(*tensors(log_ratio, mask), "token_k2,seq_mean_k1", "0.3,0.7_1.4")
    first = reference_keep(log_ratio, mask, "token_k2", None, 0.3)
    second = reference_keep(log_ratio, mask, "seq_mean_k1", 0.7, 1.4)
    assert kept.tolist() == [[float(a and b) for a, b in zip(r1, r2, strict=True)] for r1, r2 in zip(first, second,
                                                                                                  strict=True)]


def test_correct_rejects_first_then_weighs_what_is_kept_and_normalizes_to_mean_one():
    options = RolloutCorrectionOptions(rollout_is="token", rollout_is_threshold=3.0, rollout_rs="token_k2",
                                       rollout_rs_threshold=0.5, rollout_is_batch_normalize=True)
    parts = [random_batch(seed, spread=1.0) for seed in (1, 2)]
    corrections = [correct(*tensors(*part), options) for part in parts]
    for (log_ratio, mask), correction in zip(parts, corrections, strict=True):
        keep = reference_keep(log_ratio, mask, "token_k2", None, 0.5)
        assert correction.mask.tolist() == [[float(k) for k in row] for row in keep]
        assert (correction.weights[correction.mask == 0] == 0).all()
    expected = [reference_weights(lr, reference_keep(lr, m, "token_k2", None, 0.5), "token", None, 3.0)
                for lr, m in parts]
    total = sum(w for part in expected for row in part for w in row)
    count = sum(c.mask.sum().item() for c in corrections)
    factor = normalize(corrections, "token")
    assert factor == pytest.approx(total / count)
    mean = sum((c.weights * c.mask).sum().item() for c in corrections) / count
    assert mean == pytest.approx(1.0)


def test_bad_options_fail_with_a_message_naming_the_fix():
    with pytest.raises(ValidationError, match="needs rollout_rs_threshold"):
        AgentTuneConfig(algorithm={"rollout_correction": {"rollout_rs": "token_k1"}})
    with pytest.raises(ValidationError, match="one positive upper bound"):
        RolloutCorrectionOptions(rollout_rs="token_k3", rollout_rs_threshold="0.1_2")
    with pytest.raises(ValidationError, match="neither a number nor 'lower_upper'"):
        RolloutCorrectionOptions(rollout_is="token", rollout_is_threshold="two")
    with pytest.raises(ValidationError, match="set rollout_is"):
        RolloutCorrectionOptions(bypass_mode=True, loss_type="reinforce")
    with pytest.raises(ValidationError, match="2 bounds for 3 criteria"):
        RolloutCorrectionOptions(rollout_rs="token_k2,token_k3,seq_max_k2", rollout_rs_threshold="1,2")


# -- in the trainer -----------------------------------------------------------------------------------
def trainer_and_episodes(correction: dict, *, engine_logprob: float | None = None, seed: int = 0):
    from test_local_grpo import make_config, make_trainer, step_episodes

    config = make_config(algorithm={"rollout_correction": RolloutCorrectionOptions(**correction)})
    trainer = make_trainer(config)
    episodes = step_episodes(seed)
    for episode in episodes:  # the engine's logprobs, where the test sets them
        for sample in episode.samples:
            if engine_logprob is not None:
                sample.logprobs = [engine_logprob if m else 0.0 for m in sample.loss_mask]
    return trainer, episodes


def parameters(model):
    return {name: value.detach().clone() for name, value in model.named_parameters()}


def test_rejecting_every_token_leaves_the_weights_alone_and_says_so():
    # The test samples' logprobs are random in [-3, 0] while the tiny model gives ~log(1/300):
    # a tight geometric-mean bound rejects every sequence.
    trainer, episodes = trainer_and_episodes({"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.99_1.01"})
    before = parameters(trainer.model)
    metrics = trainer.step(episodes)
    assert metrics["train/rollout_rs_seq_masked_fraction"] == 1.0 and metrics["train/rollout_rs_masked_fraction"] == 1.0
    assert metrics["train/pg_loss"] == 0.0
    assert all(torch.equal(before[name], value) for name, value in parameters(trainer.model).items())


def test_truncated_weights_scale_the_update_and_report_the_mismatch():
    """The engine's logprobs (-12) are far below the untrained policy's (about log 1/300): every weight is cut."""
    trainer, episodes = trainer_and_episodes({"rollout_is": "token", "rollout_is_threshold": 2.0}, engine_logprob=-12.0)
    metrics = trainer.step(episodes)
    assert metrics["train/rollout_is_max"] == pytest.approx(2.0)
    assert metrics["train/rollout_is_truncated_fraction"] == 1.0 and metrics["train/rollout_is_raw_max"] > 2.0
    assert metrics["train/rollout_kl_k3"] > 0 and metrics["train/rollout_kl_k1"] != 0
    # Same step without correction: every token weighs 2 (the cap), so the policy loss doubles exactly.
    plain, plain_episodes = trainer_and_episodes({}, engine_logprob=-12.0)
    plain_metrics = plain.step(plain_episodes)
    assert "train/rollout_is_mean" not in plain_metrics and plain_metrics["train/pg_loss"] != 0
    assert metrics["train/pg_loss"] == pytest.approx(2 * plain_metrics["train/pg_loss"], rel=1e-5)


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_mode_trains_against_the_engine_logprobs(loss_type):
    correction = {"bypass_mode": True, "loss_type": loss_type}
    if loss_type == "reinforce":
        correction |= {"rollout_is": "sequence", "rollout_is_threshold": 5.0}
    trainer, episodes = trainer_and_episodes(correction)
    before = parameters(trainer.model)
    metrics = trainer.step(episodes)
    assert metrics["train/updates"] == 1 and metrics["train/trained_tokens"] > 0
    assert "train/rollout_kl_k3" in metrics
    if loss_type == "reinforce":
        assert metrics["train/rollout_is_max"] <= 5.0
    else:  # old = the engine's logprobs, far from the policy's: most ratios leave the clip range
        assert metrics["train/clip_fraction"] > 0
    assert any(not torch.equal(before[name], value) for name, value in parameters(trainer.model).items())


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_importance_weights_taken_in_the_update_pass_train_as_a_scoring_pass_does(level):
    """Asynchronous modes' default (truncated IS, one update a step): π_old is the current policy, so
    the update's own pass takes the weights and the scoring pass before it is left out. The same
    step with a scoring pass (forced by a rejection criterion that rejects nothing) trains the
    same weights, with one forward pass more."""
    correction = {"rollout_is": level, "rollout_is_threshold": 1.5}
    trainers = {}
    for name, extra in {"in_pass": {}, "scoring_pass": {"rollout_rs": "token_k3", "rollout_rs_threshold": 1e9}}.items():
        trainer, episodes = trainer_and_episodes(correction | extra, engine_logprob=-12.0)
        passes = []
        embeddings = trainer.model.get_input_embeddings()  # once per forward pass
        embeddings.register_forward_hook(lambda module, args, output, passes=passes: passes.append(torch.is_grad_enabled()))
        metrics = trainer.step(episodes)
        trainers[name] = (parameters(trainer.model), passes, metrics)
    (in_pass, in_pass_passes, in_pass_metrics), (scored, scored_passes, scored_metrics) = trainers.values()
    assert in_pass_passes and all(in_pass_passes)  # every forward pass carries gradients
    assert scored_passes.count(False) == len(in_pass_passes) == scored_passes.count(True)
    assert in_pass_metrics["train/rollout_is_mean"] == pytest.approx(scored_metrics["train/rollout_is_mean"])
    assert in_pass_metrics["train/rollout_is_truncated_fraction"] > 0
    assert in_pass_metrics["train/pg_loss"] == pytest.approx(scored_metrics["train/pg_loss"], rel=1e-6)
    for name, value in in_pass.items():
        torch.testing.assert_close(value, scored[name], rtol=1e-6, atol=1e-7)
