"""agenttune's objective (advantage estimator, policy loss, group handling) in verl 0.9.1's names.

Where verl has the same rule, the config selects it (plugins/verl/tests/test_verl_objectives.py
checks that each pair computes the same numbers); where it has none, `objective_problems` refuses
the config in one paragraph instead of training something else. `algorithm.overlong_shaping` needs
no translation: verl applies DAPO's penalty in its DAPO reward manager, which agenttune's agent loop
bypasses, so the agent loop subtracts the same penalty from the reward it hands verl (outputs.py).
"""

from __future__ import annotations

from typing import Any

from agenttune.plugin_api import AgentTuneConfig, UserError, get_component

# agenttune's estimator -> verl's algorithm.adv_estimator (dr_grpo: grpo without the std)
VERL_ESTIMATORS = {"grpo": "grpo", "dr_grpo": "grpo", "rloo": "rloo",
                   "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline"}
# agenttune's policy loss -> verl's actor.policy_loss.loss_mode (distillation: the task-reward part, see below)
VERL_LOSSES = {"ppo_clip": "vanilla", "gspo": "gspo", "cispo": "cispo", "distillation": "vanilla"}

# On-policy distillation. agenttune (losses/distillation.py) trains each token on
#   A_t = log π_teacher(t) - log π_old(t) + reward_weight x A_episode,  loss -A_t r_t,  r_t = π_θ / π_old,
# no clip. verl 0.9.1 with `distillation.enabled`, `distillation_loss.loss_mode: k1` and
# `use_policy_gradient: true` (trainer/distillation/losses.py) computes k1 = log π_θ - log π_teacher
# and hands -k1, detached, as the advantage to its vanilla PPO loss (ratio π_θ / π_old); with
# `use_task_rewards: true` it adds the actor's own PPO loss on the estimator's advantage (KL-to-reference
# term included) and weighs the distillation part by `distillation_loss_coef`. Both aggregate with
# `loss_agg_mode`. On the one update per step the plugin configures (ppo_mini_batch_size = the batch,
# one epoch, π_old recomputed by the actor) π_θ = π_old in value, r_t = 1, no clip binds, and the two
# are the same rule in value and gradient (plugins/verl/tests/test_verl_distillation.py):
#   reward_weight 0 -> use_task_rewards false;  reward_weight 1 -> use_task_rewards true, coefficient 1.
# Where they differ, the config is refused (`distillation_problems`): another reward_weight (verl weighs
# the distillation term, agenttune the task term: equal only up to a factor on the whole loss, which
# changes gradient clipping and the KL weight), kl_coef with reward_weight 0 (verl then drops its whole
# PPO loss, KL term included), rollout_correction.bypass_mode (π_old is then the engine's: agenttune's
# advantage uses its log-probs, verl's the trained policy's, and verl clips the ratio), a
# rollout.temperature other than 1 (verl's teacher always scores at temperature 1, agenttune's hf
# teacher at rollout.temperature) and a served teacher (verl serves its own).
DISTILLATION_REWARD_WEIGHTS = (0.0, 1.0)


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


def _distillation_options(config: AgentTuneConfig) -> Any:
    """The distillation loss's options with their defaults (validated later, when the run resolves them)."""
    options_cls = get_component("policy_losses", "distillation").Options
    return options_cls.model_construct(**config.algorithm.policy_loss_options)


def distillation_values(config: AgentTuneConfig) -> dict[str, Any]:
    """verl's `distillation` section for agenttune's distillation loss (nothing otherwise)."""
    if config.algorithm.policy_loss != "distillation":
        return {}
    options = _distillation_options(config)
    return {
        "distillation.enabled": True,
        "distillation.distillation_loss.loss_mode": "k1",
        "distillation.distillation_loss.use_policy_gradient": True,
        "distillation.distillation_loss.use_task_rewards": options.reward_weight > 0,
        "distillation.distillation_loss.distillation_loss_coef": 1.0,
        "distillation.distillation_loss.loss_max_clamp": None,  # agenttune does not clamp the advantage
        "distillation.teacher_models.teacher_model.model_path": options.teacher,
        # the teacher's pool is shaped like the actor's nodes; how many nodes is the user's to say
        "distillation.n_gpus_per_node": config.trainer.n_gpus_per_node,
        "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size":
            min(2, config.trainer.n_gpus_per_node),
    }


def distillation_problems(config: AgentTuneConfig) -> list[UserError]:
    """What of agenttune's distillation verl 0.9.1 cannot run as the same rule (see the comment above)."""
    algorithm = config.algorithm
    options = _distillation_options(config)
    local = "or train this objective with --backbone local"
    problems = []
    # hf and vllm both name a teacher directory loaded beside the student: verl serves it with its own vLLM.
    if options.teacher_engine == "openai":
        problems.append(UserError(
            f"algorithm.policy_loss_options.teacher_engine={options.teacher_engine!r} has no equivalent in "
            "verl 0.9.1: verl serves the distillation teacher itself, on its own GPUs "
            "(distillation.teacher_models.teacher_model.model_path), and cannot score with a server agenttune "
            "points it to.",
            hint=f"Set policy_loss_options.teacher to the teacher's model directory (teacher_engine: hf), {local}."))
    elif options.teacher_engine_options:
        problems.append(UserError(
            "algorithm.policy_loss_options.teacher_engine_options set up agenttune's own vLLM teacher; verl 0.9.1 "
            "serves the teacher itself and would not read them.",
            hint="Drop teacher_engine_options and size verl's teacher with verl: {distillation: {nnodes: N}} "
                 "(or verl.overrides), or train this objective with --backbone local."))
    elif str(options.teacher).startswith("tiny://"):
        problems.append(UserError(
            f"algorithm.policy_loss_options.teacher={options.teacher!r}: verl loads real model "
            "directories, not agenttune's tiny:// test models.",
            hint="Write one with `agenttune model init-tiny DIR` and set the teacher to DIR."))
    weight = float(options.reward_weight)
    if weight not in DISTILLATION_REWARD_WEIGHTS:
        problems.append(UserError(
            f"algorithm.policy_loss_options.reward_weight={weight:g} has no equivalent in verl 0.9.1: verl adds its "
            "task-reward PPO loss at weight 1 and weighs the distillation term (distillation_loss_coef), while "
            "agenttune weighs the task term; the two agree only up to a factor on the whole loss, which changes "
            "gradient clipping and the KL term's weight.",
            hint=f"Use reward_weight 0 (pure distillation) or 1 (distillation + the estimator's advantage), {local}."))
    if weight == 0.0 and algorithm.kl_coef > 0:
        problems.append(UserError(
            f"algorithm.kl_coef={algorithm.kl_coef:g} with pure distillation (reward_weight 0) has no equivalent in "
            "verl 0.9.1: without task rewards verl's distillation loss replaces the actor's whole PPO loss, the "
            "KL-to-reference term included, so the KL penalty would silently vanish.",
            hint=f"Set algorithm.kl_coef: 0, or reward_weight: 1, {local}."))
    if algorithm.rollout_correction.bypass_mode:
        problems.append(UserError(
            "algorithm.rollout_correction.bypass_mode with policy_loss distillation has no equivalent in verl "
            "0.9.1: bypass mode makes the engine's log-probs π_old, so agenttune's distillation advantage is "
            "log π_teacher - log π_engine with an unclipped ratio, while verl's is log π_teacher - log π_θ with its "
            "ratio clipped (distillation_loss.clip_ratio_low/high).",
            hint=f"Turn bypass_mode off (decoupled rollout correction is translated), {local}."))
    if config.rollout.temperature != 1.0:
        problems.append(UserError(
            f"rollout.temperature={config.rollout.temperature:g} with policy_loss distillation has no equivalent in "
            "verl 0.9.1: verl's teacher always scores at temperature 1 while the student's log-probs are taken at "
            "rollout.temperature; agenttune's hf teacher scores at rollout.temperature, so the per-token "
            "advantage would differ.",
            hint=f"Set rollout.temperature: 1.0 for distillation on verl, {local}."))
    return problems


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
    if algorithm.policy_loss == "distillation":
        problems += distillation_problems(config)
    if algorithm.zero_variance_groups == "drop" and not algorithm.dynamic_sampling.enable:
        problems.append(UserError(
            "algorithm.zero_variance_groups=drop is not available with the verl backbone: verl keeps every episode "
            "of a group without reward spread in the batch (advantage 0, its tokens in the token-mean "
            "denominator), and its only way to leave such groups out is to replace them (filter_groups).",
            hint="Remove algorithm.zero_variance_groups (keep, the default, is verl's behaviour), or set "
                 "algorithm.dynamic_sampling.enable: true, which becomes verl's algorithm.filter_groups."))
    return problems
