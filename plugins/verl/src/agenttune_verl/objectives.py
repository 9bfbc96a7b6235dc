"""agenttune's objective (advantage estimator, policy loss, group handling) in verl 0.9.1's names.

Where verl has the same rule, the config selects it (plugins/verl/tests/test_verl_objectives.py
checks that each pair computes the same numbers); where it has none, `objective_problems` refuses
the config in one paragraph instead of training something else.
"""

from __future__ import annotations

from agenttune.plugin_api import AgentTuneConfig, UserError, get_component

# agenttune's estimator -> verl's algorithm.adv_estimator (dr_grpo: grpo without the std)
VERL_ESTIMATORS = {"grpo": "grpo", "dr_grpo": "grpo", "rloo": "rloo",
                   "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline"}
# agenttune's policy loss -> verl's actor.policy_loss.loss_mode
VERL_LOSSES = {"ppo_clip": "vanilla", "gspo": "gspo", "cispo": "cispo"}


def adv_estimator(config: AgentTuneConfig) -> str:
    return VERL_ESTIMATORS.get(config.algorithm.adv_estimator, config.algorithm.adv_estimator)


def norm_adv_by_std(config: AgentTuneConfig) -> bool:
    algorithm = config.algorithm
    if algorithm.adv_estimator == "dr_grpo":
        return False
    return bool(algorithm.estimator_options.get("norm_by_std", algorithm.norm_adv_by_std))


def loss_mode(config: AgentTuneConfig) -> str:
    return VERL_LOSSES.get(config.algorithm.policy_loss, config.algorithm.policy_loss)


def loss_agg_mode(config: AgentTuneConfig) -> str:
    """GSPO is defined with a per-sequence mean (agenttune's gspo always uses it; verl takes the setting)."""
    return "seq-mean-token-mean" if config.algorithm.policy_loss == "gspo" else config.algorithm.loss_agg_mode


def max_num_gen_batches(config: AgentTuneConfig) -> int:
    """verl counts generation batches per step (the first included); agenttune counts extra rounds."""
    return config.algorithm.dynamic_sampling.max_retries + 1


def objective_problems(config: AgentTuneConfig) -> list[UserError]:
    algorithm = config.algorithm
    problems = []
    if algorithm.adv_estimator not in VERL_ESTIMATORS:
        problems.append(UserError(
            f"algorithm.adv_estimator={algorithm.adv_estimator!r} has no equivalent in verl 0.9.1: verl's estimators "
            "give one advantage per episode from its group (grpo, rloo, reinforce_plus_plus_baseline, ...), and an "
            "agenttune estimator that is not one of them (per-turn returns, a plugin's) would have to run inside "
            "verl's trainer.",
            hint=f"Use one of {', '.join(VERL_ESTIMATORS)} with --backbone verl, or train this objective with "
                 "--backbone local."))
    else:
        try:  # the same rule as the local backbone: no training on groups too small to compare
            get_component("advantage_estimators", algorithm.adv_estimator).check_group_size(config.rollout.num_repeat)
        except UserError as error:
            problems.append(error)
    if algorithm.policy_loss not in VERL_LOSSES:
        problems.append(UserError(
            f"algorithm.policy_loss={algorithm.policy_loss!r} has no equivalent in verl 0.9.1's policy losses.",
            hint=f"Use one of {', '.join(VERL_LOSSES)} with --backbone verl (or set verl's own "
                 "actor_rollout_ref.actor.policy_loss.loss_mode in the verl: section), or use --backbone local."))
    if algorithm.zero_variance_groups == "drop" and not algorithm.dynamic_sampling.enable:
        problems.append(UserError(
            "algorithm.zero_variance_groups=drop is not available with the verl backbone: verl keeps every episode "
            "of a group without reward spread in the batch (advantage 0, its tokens in the token-mean "
            "denominator), and its only way to leave such groups out is to replace them (filter_groups).",
            hint="Remove algorithm.zero_variance_groups (keep, the default, is verl's behaviour), or set "
                 "algorithm.dynamic_sampling.enable: true, which becomes verl's algorithm.filter_groups."))
    if algorithm.overlong_shaping.enable:
        problems.append(UserError(
            "algorithm.overlong_shaping is not yet translated for the verl backbone: verl 0.9.1 applies DAPO's "
            "overlong penalty in its DAPO reward manager, which agenttune's agent loop (it hands verl the judge's "
            "reward) does not run.",
            hint="Turn overlong_shaping off for --backbone verl, or use --backbone local."))
    return problems
