"""Each built-in policy loss equals a direct, token-by-token computation: its value and its gradient."""

from __future__ import annotations

import math

import pytest

from agenttune.components.losses.base import LossInput
from agenttune.components.losses.policy_gradient import CISPOLoss, GSPOLoss, PPOClipLoss
from agenttune.registry.manager import get_component

torch = pytest.importorskip("torch")


def random_batch(seed: int, rows: int = 5, tokens: int = 7):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 3
    current = (old + torch.randn(rows, tokens, generator=generator, dtype=torch.float64) * 0.4).requires_grad_()
    advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
    mask = (torch.rand(rows, tokens, generator=generator) > 0.3).double()
    mask[:, 0] = 1.0  # every row trains at least one token
    return current, old, advantages, mask


def direct(rule, current, old, advantages, mask, low, high) -> list[list[float]]:
    """The per-token loss written out with Python floats, from the papers' formulas."""
    rows, tokens = current.shape
    c, o, m = current.detach().tolist(), old.tolist(), mask.tolist()
    out = []
    for i in range(rows):
        a = float(advantages[i])
        trained = [t for t in range(tokens) if m[i][t]]
        sequence_ratio = math.exp(sum(c[i][t] - o[i][t] for t in trained) / len(trained))
        row = []
        for t in range(tokens):
            ratio = math.exp(c[i][t] - o[i][t])
            if rule == "ppo_clip":
                row.append(max(-a * ratio, -a * min(max(ratio, 1 - low), 1 + high)))
            elif rule == "gspo":
                row.append(max(-a * sequence_ratio, -a * min(max(sequence_ratio, 1 - low), 1 + high)))
            else:  # cispo
                row.append(-min(max(ratio, 1 - low), 1 + high) * a * c[i][t])
        out.append(row)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("rule", "low", "high"), [("ppo_clip", 0.2, 0.28), ("gspo", 3e-4, 4e-4), ("gspo", 0.2, 0.2),
                                                   ("cispo", 0.2, 0.28)])
def test_each_loss_equals_the_direct_computation(rule, low, high, seed):
    current, old, advantages, mask = random_batch(seed)
    loss = get_component("policy_losses", rule)()
    output = loss(LossInput(current, old, advantages, mask, clip_low=low, clip_high=high))
    expected = [value for row in direct(rule, current, old, advantages, mask, low, high) for value in row]
    assert output.per_token.detach().flatten().tolist() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_ppo_clip_gradient_vanishes_where_the_clip_wins_and_cispo_keeps_it():
    """PPO drops the gradient of a token whose ratio left the range on the advantage's side; CISPO's
    weight is clipped but the token still pulls (the point of CISPO)."""
    old = torch.zeros(1, 1, dtype=torch.float64)
    current = torch.full((1, 1), math.log(1.5), dtype=torch.float64, requires_grad=True)  # ratio 1.5
    batch = LossInput(current, old, torch.ones(1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                      clip_low=0.2, clip_high=0.2)
    ppo = PPOClipLoss()(batch)
    ppo.per_token.sum().backward()
    assert float(current.grad) == 0.0 and float(ppo.clipped) == 1.0
    current.grad = None
    cispo = CISPOLoss()(batch)
    cispo.per_token.sum().backward()
    assert float(current.grad) == pytest.approx(-1.2) and float(cispo.clipped) == 1.0  # -sg(clip(r)) * A


def test_gspo_gives_every_token_of_a_row_the_sequence_ratio_and_its_own_gradient():
    current, old, advantages, mask = random_batch(9)
    output = GSPOLoss()(LossInput(current, old, advantages, mask, clip_low=10.0, clip_high=10.0))  # no clipping
    (output.per_token * mask).sum().backward()
    for row in range(current.shape[0]):
        trained = mask[row].bool()
        ratio = torch.exp(((current - old) * mask)[row].sum() / mask[row].sum()).detach()
        # d(-A s)/d logp_t with s carried by each token: -A s on every trained token
        assert current.grad[row][trained].tolist() == pytest.approx([float(-advantages[row] * ratio)] * int(
            trained.sum()), rel=1e-9)
    assert GSPOLoss.loss_agg_mode == "seq-mean-token-mean"


def test_cross_entropy_is_the_negative_log_likelihood_weighted_by_the_advantage():
    current, old, advantages, mask = random_batch(5)
    output = get_component("policy_losses", "cross_entropy")()(
        LossInput(current, old, torch.ones_like(advantages), mask, clip_low=0.2, clip_high=0.2))
    assert torch.equal(output.per_token, -current) and not output.clipped.any()
    mean_nll = (output.per_token * mask).sum() / mask.sum()
    assert float(mean_nll) == pytest.approx(float(-(current * mask).sum() / mask.sum()))


def test_distillation_uses_the_teachers_log_probs_as_per_token_advantages():
    current, old, advantages, mask = random_batch(7)
    teacher = old + torch.randn_like(old) * 0.5
    loss = get_component("policy_losses", "distillation")(
        get_component("policy_losses", "distillation").Options(teacher="unused-here"))
    student = current.detach().clone().requires_grad_()
    output = loss(LossInput(student, old, advantages, mask, clip_low=0.2, clip_high=0.2, teacher_logprobs=teacher))
    expected = (-(teacher - old) * torch.exp(current - old)).detach()
    torch.testing.assert_close(output.per_token.detach(), expected)
    output.per_token.sum().backward()
    torch.testing.assert_close(student.grad, expected)  # d/dlogp of -A exp(logp - old) is the value itself
    with_reward = get_component("policy_losses", "distillation")(
        get_component("policy_losses", "distillation").Options(teacher="x", reward_weight=0.5))
    mixed = with_reward(LossInput(current, old, advantages, mask, clip_low=0.2, clip_high=0.2,
                                  teacher_logprobs=teacher))
    torch.testing.assert_close(mixed.per_token.detach(), (-((teacher - old) + 0.5 * advantages.unsqueeze(-1))
                                                          * torch.exp(current - old)).detach())
