"""agenttune's advantage estimators and policy losses against verl 0.9.1's registered functions
(`verl.trainer.ppo.core_algos`): the same random batches give the same advantages, losses and gradients.

Batches mix group sizes 1 to 16, uneven response lengths and failed episodes. Failed episodes are
dropped from training by both backbones before any statistic (the local trainer's `scored_groups`,
the verl agent loop's `outputs.py`), so each side sees the episodes that did not fail.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from agenttune.plugin_api import LossInput, Scored, get_component

# agenttune's name -> (verl's adv_estimator, keyword arguments of verl's function)
ESTIMATORS = {
    "grpo": ("grpo", {"norm_adv_by_std_in_grpo": True}),
    "dr_grpo": ("grpo", {"norm_adv_by_std_in_grpo": False}),
    "rloo": ("rloo", {}),
    "reinforce_plus_plus_baseline": ("reinforce_plus_plus_baseline", {}),
}
LOSSES = {"ppo_clip": "vanilla", "gspo": "gspo", "cispo": "cispo"}


def random_episodes(seed: int) -> list[tuple[str, Scored, bool]]:
    """(group, episode, failed) for a batch of groups of 1 to 16 episodes, a few of them failed."""
    rng = random.Random(seed)
    episodes = []
    for group in range(rng.randint(1, 8)):
        for index in range(rng.randint(1, 16)):
            reward = rng.choice([0.0, 1.0, 0.5, -1.0, rng.uniform(-2, 2)])
            scored = Scored(f"g{group}-{index}", reward, tokens=rng.randint(1, 30))
            episodes.append((f"g{group}", scored, rng.random() < 0.15))
    return episodes


def verl_advantages(name: str, kept: list[tuple[str, Scored]]) -> dict[str, float]:
    """verl's function on the batch as its trainer holds it: the reward on the last response token."""
    verl_name, kwargs = ESTIMATORS[name]
    length = max(scored.tokens for _, scored in kept)
    mask = torch.zeros(len(kept), length)
    rewards = torch.zeros(len(kept), length)
    for row, (_, scored) in enumerate(kept):
        mask[row, : scored.tokens] = 1.0
        rewards[row, scored.tokens - 1] = scored.reward
    index = np.array([group for group, _ in kept], dtype=object)
    advantages, _ = core_algos.get_adv_estimator_fn(verl_name)(
        token_level_rewards=rewards, response_mask=mask, index=index, epsilon=1e-6, **kwargs)
    result = {}
    for row, (_, scored) in enumerate(kept):
        values = advantages[row, : scored.tokens]
        assert torch.allclose(values, values[0].expand_as(values)), "one advantage per episode"
        result[scored.episode_id] = float(values[0])
    return result


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_estimator_equals_verls_registered_function(name, seed):
    episodes = random_episodes(seed)
    kept = [(group, scored) for group, scored, failed in episodes if not failed]
    if sum(scored.tokens for _, scored in kept) < 2:
        pytest.skip("verl's whitening needs two tokens")
    groups: dict[str, list[Scored]] = {}
    for group, scored in kept:
        groups.setdefault(group, []).append(scored)
    ours = get_component("advantage_estimators", name)().estimate(groups).by_episode
    theirs = verl_advantages(name, kept)
    assert ours.keys() == theirs.keys()
    for episode_id, value in theirs.items():
        assert ours[episode_id] == pytest.approx(value, rel=2e-4, abs=2e-5), episode_id


def loss_batch(seed: int, rows: int = 6, tokens: int = 9):
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 2
    current = old + torch.randn(rows, tokens, generator=generator, dtype=torch.float64) * 0.3
    advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
    lengths = torch.randint(1, tokens + 1, (rows,), generator=generator)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).to(torch.float64)
    return current, old, advantages, mask


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "token-mean":
        return (per_token * mask).sum() / mask.sum()
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("name", "low", "high"), [("ppo_clip", 0.2, 0.28), ("gspo", 3e-4, 4e-4), ("gspo", 0.2, 0.2),
                                                   ("cispo", 0.2, 0.28)])
def test_each_loss_equals_verls_policy_loss_in_value_and_gradient(name, low, high, seed):
    current, old, advantages, mask = loss_batch(seed)
    loss = get_component("policy_losses", name)()
    mode = loss.loss_agg_mode or "token-mean"
    ours_input = current.clone().requires_grad_()
    output = loss(LossInput(ours_input, old, advantages, mask, clip_low=low, clip_high=high))
    ours = aggregate(output.per_token, mask, mode)
    ours.backward()
    # clip_ratio_c: verl's dual clip for negative advantages; agenttune's ppo_clip has none, so it is
    # set out of reach here (docs/local.md says so in the table of objectives).
    config = ActorConfig(strategy="fsdp", clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=1e9,
                         ppo_micro_batch_size_per_gpu=1, rollout_n=1)
    theirs_input = current.clone().requires_grad_()
    theirs, _ = core_algos.get_policy_loss_fn(LOSSES[name])(
        old_log_prob=old, log_prob=theirs_input, advantages=advantages.unsqueeze(-1).expand_as(mask),
        response_mask=mask, loss_agg_mode=mode, config=config)
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6, abs=1e-9)
    torch.testing.assert_close(ours_input.grad, theirs_input.grad, rtol=1e-6, atol=1e-9)


# -- the translation ------------------------------------------------------------------------------------
def verl_values(**algorithm):
    from agenttune_verl.translation import VerlPaths, translated_values

    from agenttune.plugin_api import load_config

    config = load_config({"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}, "algorithm": algorithm}, backbone="verl")
    return translated_values(config, VerlPaths.placeholder(config)), config


@pytest.mark.parametrize(("ours", "estimator", "norm"), [("grpo", "grpo", True), ("dr_grpo", "grpo", False),
                                                         ("rloo", "rloo", True),
                                                         ("reinforce_plus_plus_baseline", "reinforce_plus_plus_baseline",
                                                          True)])
def test_each_estimator_becomes_verls_own(ours, estimator, norm):
    values, _ = verl_values(adv_estimator=ours)
    assert values["algorithm.adv_estimator"] == estimator
    assert values["algorithm.norm_adv_by_std_in_grpo"] is norm


@pytest.mark.parametrize(("ours", "mode", "aggregation"), [("ppo_clip", "vanilla", "token-mean"),
                                                           ("gspo", "gspo", "seq-mean-token-mean"),
                                                           ("cispo", "cispo", "token-mean")])
def test_each_loss_becomes_verls_loss_mode(ours, mode, aggregation):
    values, _ = verl_values(policy_loss=ours)
    assert values["actor_rollout_ref.actor.policy_loss.loss_mode"] == mode
    assert values["actor_rollout_ref.actor.loss_agg_mode"] == aggregation


def test_dynamic_sampling_becomes_filter_groups():
    values, _ = verl_values(dynamic_sampling={"enable": True, "max_retries": 3})
    assert values["algorithm.filter_groups.enable"] is True
    assert values["algorithm.filter_groups.metric"] == "reward"
    assert values["algorithm.filter_groups.max_num_gen_batches"] == 4


@pytest.mark.parametrize(("algorithm", "words"), [
    ({"adv_estimator": "turn_grpo"}, "no equivalent in verl"),
    ({"zero_variance_groups": "drop"}, "zero_variance_groups=drop is not available"),
])
def test_objectives_verl_lacks_are_refused_in_one_paragraph(algorithm, words):
    from agenttune_verl.backbone import config_problems

    _, config = verl_values(**algorithm)
    problems = [str(problem) for problem in config_problems(config)]
    assert any(words in problem for problem in problems), problems
