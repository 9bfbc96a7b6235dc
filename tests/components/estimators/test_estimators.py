"""The built-in advantage estimators against direct computations, and the estimator plugin kind."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenttune.components.estimators.base import AdvantageEstimator, Advantages, Scored
from agenttune.components.estimators.outcome import (
    DrGRPOEstimator,
    GRPOEstimator,
    ReinforcePlusPlusBaselineEstimator,
    RLOOEstimator,
)
from agenttune.components.estimators.turns import TurnGRPOEstimator, TurnGRPOOptions
from agenttune.errors import PluginError, UserError
from agenttune.registry.config_loading import load_config
from agenttune.registry.hookspecs import hookimpl
from agenttune.registry.manager import get_component

REWARDS = st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 3.0])
GROUPS = st.dictionaries(st.sampled_from("abcdefgh"), st.lists(st.tuples(REWARDS, st.integers(1, 40)), min_size=1,
                                                               max_size=16), min_size=1)


def as_groups(groups: dict[str, list[tuple[float, int]]]) -> dict[str, list[Scored]]:
    return {group: [Scored(f"{group}-{index}", reward, tokens=tokens) for index, (reward, tokens) in enumerate(members)]
            for group, members in groups.items()}


def expected_grpo(groups, norm: bool) -> dict[str, float]:
    expected = {}
    for group, members in groups.items():
        rewards = [reward for reward, _ in members]
        mean, std = (0.0, 1.0) if len(rewards) == 1 else (statistics.mean(rewards), statistics.stdev(rewards))
        for index, reward in enumerate(rewards):
            expected[f"{group}-{index}"] = (reward - mean) / (std + 1e-6) if norm else reward - mean
    return expected


def expected_rloo(groups) -> dict[str, float]:
    expected = {}
    for group, members in groups.items():
        rewards = [reward for reward, _ in members]
        for index, reward in enumerate(rewards):
            others = rewards[:index] + rewards[index + 1:]
            expected[f"{group}-{index}"] = reward - statistics.mean(others) if others else reward
    return expected


def expected_reinforce_pp_baseline(groups) -> dict[str, float]:
    """Group-centred rewards, whitened over every generated token of the batch."""
    per_token, owners = [], []
    for group, members in groups.items():
        rewards = [reward for reward, _ in members]
        mean = statistics.mean(rewards) if len(rewards) > 1 else 0.0
        for index, (reward, tokens) in enumerate(members):
            per_token += [reward - mean] * tokens
            owners.append((f"{group}-{index}", reward - mean))
    if len(per_token) < 2:
        return {owner: 0.0 for owner, _ in owners}
    mean, variance = statistics.mean(per_token), statistics.variance(per_token)
    return {owner: (value - mean) / math.sqrt(variance + 1e-8) for owner, value in owners}


def check(result: Advantages, expected: dict[str, float]) -> None:
    assert result.by_episode.keys() == expected.keys() and not result.by_call
    for key, value in expected.items():
        assert result.by_episode[key] == pytest.approx(value, rel=1e-9, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(groups=GROUPS)
def test_every_outcome_estimator_equals_a_direct_computation(groups):
    scored = as_groups(groups)
    check(GRPOEstimator().estimate(scored), expected_grpo(groups, norm=True))
    check(DrGRPOEstimator().estimate(scored), expected_grpo(groups, norm=False))
    check(RLOOEstimator().estimate(scored), expected_rloo(groups))
    check(ReinforcePlusPlusBaselineEstimator().estimate(scored), expected_reinforce_pp_baseline(groups))


def test_grpo_options_turn_the_std_off():
    groups = {"g": [(1.0, 1), (0.0, 1), (0.0, 1)]}
    estimator = GRPOEstimator(GRPOEstimator.Options(norm_by_std=False))
    check(estimator.estimate(as_groups(groups)), expected_grpo(groups, norm=False))


def test_informative_groups_need_spread_except_for_a_batch_baseline():
    lone, flat, spread = [Scored("a", 1.0)], [Scored("b", 1.0), Scored("c", 1.0)], [Scored("d", 1.0), Scored("e", 0.0)]
    for estimator in (GRPOEstimator(), DrGRPOEstimator(), RLOOEstimator()):
        assert [estimator.informative(group) for group in (lone, flat, spread)] == [False, False, True]
    assert [ReinforcePlusPlusBaselineEstimator().informative(group) for group in (lone, flat, spread)] == [
        True, False, True]


# -- per-turn rewards ---------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    episodes=st.lists(st.tuples(REWARDS, st.lists(REWARDS, min_size=1, max_size=5)), min_size=1, max_size=6),
    gamma=st.sampled_from([1.0, 0.9, 0.5, 0.0]),
)
def test_turn_grpo_equals_discounted_returns_normalised_within_the_group(episodes, gamma):
    scored = {"g": [Scored(f"e{index}", reward, calls=len(turns), turn_rewards=tuple(turns))
                    for index, (reward, turns) in enumerate(episodes)]}
    result = TurnGRPOEstimator(TurnGRPOOptions(gamma=gamma)).estimate(scored)
    returns = {}
    for index, (reward, turns) in enumerate(episodes):
        returns[f"e{index}"] = [sum(gamma ** (k - t) * turns[k] for k in range(t, len(turns)))
                                + gamma ** (len(turns) - t) * reward for t in range(len(turns))]
    pooled = [value for values in returns.values() for value in values]
    mean, std = (statistics.mean(pooled), statistics.stdev(pooled)) if len(pooled) > 1 else (0.0, 1.0)
    assert not result.by_episode and result.by_call.keys() == returns.keys()
    for key, values in returns.items():
        assert result.by_call[key] == pytest.approx([(value - mean) / (std + 1e-6) for value in values], abs=1e-9)


def test_turn_grpo_without_turn_rewards_is_grpo_on_every_call():
    groups = {"g": [Scored("a", 1.0, calls=2), Scored("b", 0.0, calls=3)]}
    result = TurnGRPOEstimator().estimate(groups)
    positive, negative = result.by_call["a"], result.by_call["b"]
    assert len(positive) == 2 and len(negative) == 3
    assert len(set(positive)) == 1 and positive[0] > 0 > negative[0]


def test_rejection_sampling_keeps_the_episodes_that_pass_with_weight_one():
    from agenttune.components.estimators.rejection import RejectionSamplingEstimator, RejectionSamplingOptions

    estimator = RejectionSamplingEstimator(RejectionSamplingOptions(threshold=0.5))
    groups = as_groups({"a": [(1.0, 3), (0.0, 2), (0.5, 1)], "b": [(0.2, 4)]})
    check(estimator.estimate(groups), {"a-0": 1.0, "a-2": 1.0})
    assert [estimator.informative(members) for members in groups.values()] == [True, False]
    RejectionSamplingEstimator.check_group_size(1)


# -- the plugin kind ----------------------------------------------------------------------------------
def test_the_built_ins_are_registered():
    assert get_component("advantage_estimators", "rloo") is RLOOEstimator
    assert get_component("policy_losses", "gspo").name == "gspo"


def test_unknown_names_and_bad_options_are_user_errors():
    from agenttune.registry.resolution import resolve_objective

    with pytest.raises(PluginError, match="Did you mean 'rloo'"):
        resolve_objective(load_config({"algorithm": {"adv_estimator": "rlo"}}))
    with pytest.raises(PluginError, match=r"unknown policy loss 'cipso'\. Available: .*\. Did you mean 'cispo'\?"):
        resolve_objective(load_config({"algorithm": {"policy_loss": "cipso"}}))
    with pytest.raises(UserError, match="algorithm.estimator_options.*'turn_grpo'.*gamma"):
        resolve_objective(load_config({"algorithm": {"adv_estimator": "turn_grpo",
                                                     "estimator_options": {"gamma": 2.0}}}))


def test_num_repeat_1_is_refused_for_group_estimators_and_accepted_with_a_batch_baseline(tmp_path, run_cli):
    with pytest.raises(UserError, match="num_repeat is 1.*'grpo'.*at least 2.*reinforce_plus_plus_baseline"):
        GRPOEstimator.check_group_size(1)
    for estimator in (RLOOEstimator, DrGRPOEstimator, TurnGRPOEstimator):
        with pytest.raises(UserError):
            estimator.check_group_size(1)
    ReinforcePlusPlusBaselineEstimator.check_group_size(1)
    GRPOEstimator.check_group_size(2)


def test_the_local_backbone_refuses_num_repeat_1_with_grpo_before_it_starts():
    from agenttune.backbones.local import LocalBackbone

    base = {"model": {"path": "tiny://default"}, "rollout": {"num_repeat": 1}, "monitor": {"tensorboard": False}}
    with pytest.raises(UserError, match="num_repeat is 1"):
        LocalBackbone.check(load_config(base))
    LocalBackbone.check(load_config({**base, "algorithm": {"adv_estimator": "reinforce_plus_plus_baseline"}}))


def test_norm_adv_by_std_false_still_selects_the_dr_grpo_rule_for_grpo():
    from agenttune.registry.resolution import resolve_objective

    estimator, _ = resolve_objective(load_config({"algorithm": {"norm_adv_by_std": False}}))
    groups = {"g": [(1.0, 1), (0.0, 1), (0.0, 1)]}
    check(estimator.estimate(as_groups(groups)), expected_grpo(groups, norm=False))


class MedianBaseline(AdvantageEstimator):
    name = "median_baseline"

    def estimate(self, groups):
        return Advantages({member.episode_id: member.reward - statistics.median(m.reward for m in members)
                           for members in groups.values() for member in members})


def test_a_plugin_adds_an_estimator_that_the_config_selects_and_plugins_list_shows(register_plugin, run_cli):
    class Plugin:  # what an entry point's module holds
        @staticmethod
        @hookimpl
        def register_advantage_estimators():
            return [MedianBaseline]

    register_plugin(Plugin(), name="median", distribution="agenttune-median")
    from agenttune.registry.resolution import resolve_objective

    estimator, _ = resolve_objective(load_config({"algorithm": {"adv_estimator": "median_baseline"}}))
    assert estimator.estimate({"g": [Scored("a", 3.0), Scored("b", 1.0), Scored("c", 0.0)]}).by_episode == {
        "a": 2.0, "b": 0.0, "c": -1.0}
    listed = run_cli("plugins", "list")
    assert listed.exit_code == 0 and "advantage estimators: median_baseline" in listed.output
    plugins = {plugin["name"]: plugin for plugin in json.loads(run_cli("plugins", "list", "--json").output)}
    assert plugins["median"]["advantage_estimators"] == ["median_baseline"]
    assert plugins["builtins"]["advantage_estimators"] == [
        "grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "turn_grpo", "rejection_sampling"]
    assert plugins["builtins"]["policy_losses"] == ["ppo_clip", "gspo", "cispo", "cross_entropy", "distillation"]
