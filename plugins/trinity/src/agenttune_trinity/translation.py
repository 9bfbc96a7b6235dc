"""agenttune's configuration, translated into Trinity-RFT's.

`TRANSLATIONS` is the one table of what agenttune sets in Trinity-RFT 0.6.0's config: each row names a
Trinity key (dotted path into `trinity.common.config.Config`), the agenttune key(s) it comes from, and
how its value is computed. Rows whose value is `None` are left out, so Trinity's own default (or its
validator's auto-detection) applies. The `trinity:` section of the agenttune config is merged on top,
key by key, so it can override anything here or set what the table does not (see `trinity_config`).

The README's translation table is generated from this one (`markdown_table()`), and the tests load
the result through Trinity's own `load_config` and `Config.check_and_update()`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agenttune.plugin_api import AgentTuneConfig, UserError
from agenttune_trinity.options import TrinityOptions, tinker_mode

# The Trinity workflow that runs agenttune workflows, by dotted path: Trinity imports it in each of
# its workflow-runner processes (`WORKFLOWS.get("pkg.mod.Class")`), nothing has to be pre-registered.
WORKFLOW_TYPE = "agenttune_trinity.workflow.AgentTuneWorkflow"
# The Trinity monitor that also writes agenttune's `<run_dir>/metrics.jsonl`.
MONITOR_TYPE = "agenttune_trinity.monitor.AgentTuneMonitor"

TRAIN_TASKSET = "agenttune_train"
VALIDATION_TASKSET = "agenttune_validation"
NEVER = 1_000_000_000  # an eval interval no run reaches: "validate only before training"
# How long Trinity waits for one task's group beyond agenttune's own episode and judge timeouts,
# which fire first and mark the episode instead of failing the whole group.
TIMEOUT_SLACK_S = 60


@dataclass(frozen=True)
class TrinityPaths:
    """Where a run's files live; `placeholder()` is what `config show` prints before a run exists."""

    run_dir: str
    tasks: str  # the taskset directory: train.jsonl and validation.jsonl (see taskset.py)
    checkpoints: str
    model: str  # the model directory (`tiny://` and the like resolved)
    run_name: str  # the run directory's name (its time stamp), which keeps Ray namespaces apart

    @classmethod
    def for_run(cls, run_dir: Path, model: str) -> TrinityPaths:
        run_dir = run_dir.resolve()
        return cls(str(run_dir), str(run_dir / "trinity" / "tasks"), str(run_dir / "checkpoints"), model,
                   run_dir.name)

    @classmethod
    def placeholder(cls, config: AgentTuneConfig) -> TrinityPaths:
        return cls("<run_dir>", "<run_dir>/trinity/tasks", "<run_dir>/checkpoints", config.model.path, "<run>")

    @property
    def metrics_file(self) -> str:
        return f"{self.run_dir}/metrics.jsonl"


Value = Callable[[AgentTuneConfig, TrinityPaths], Any]


@dataclass(frozen=True)
class Translation:
    trinity_key: str
    source: str  # the agenttune key(s) it comes from, for the docs
    value: Value


# -- derived values ---------------------------------------------------------------------------------
def total_gpus(config: AgentTuneConfig) -> int:
    return config.trainer.n_gpus_per_node * config.trainer.nnodes


def mode(config: AgentTuneConfig) -> str:
    # One GPU: rollout and training take turns on it (Trinity's `colocate`). More: they split them.
    # Tinker mode: the Tinker server holds the model; explorer and trainer run side by side on no GPU.
    return "colocate" if total_gpus(config) == 1 and not tinker_mode(config) else "both"


def gpu_cluster(config: AgentTuneConfig) -> bool:
    """The config names the cluster's GPUs (else Trinity asks Ray; Tinker mode uses none)."""
    return bool(config.trainer.n_gpus_per_node) and not tinker_mode(config)


def rollout_engines(config: AgentTuneConfig) -> int:
    # Half of the GPUs serve rollouts (one vLLM engine each), the other half train; a distillation
    # teacher's GPU is taken out first.
    return max(1, (total_gpus(config) - teacher_gpus(config)) // 2) if mode(config) == "both" else 1


def runners_per_engine(config: AgentTuneConfig) -> int:
    # Each Trinity runner rolls out one task's whole group (num_repeat episodes) at once, so this many
    # runners keep about rollout.max_env_worker episodes in flight per engine.
    return max(1, config.rollout.max_env_worker // config.rollout.num_repeat)


def task_timeout(config: AgentTuneConfig) -> int:
    rounds = math.ceil(config.rollout.num_repeat / config.rollout.max_env_worker)
    per_round = config.rollout.episode_timeout + config.judge.timeout
    return math.ceil(rounds * per_round) + TIMEOUT_SLACK_S


def kl_loss(config: AgentTuneConfig) -> str:
    return config.algorithm.kl_estimator if config.algorithm.kl_coef > 0 else "none"


def rollout_dtype(config: AgentTuneConfig) -> str:
    return "bfloat16" if config.model.dtype == "auto" else config.model.dtype


def monitor_inner(config: AgentTuneConfig) -> list[str] | None:
    """The Trinity monitors agenttune's monitor hands the metrics to: every one enabled (Trinity itself runs
    one monitor class; agenttune's fans out, so enabling wandb does not drop the default tensorboard)."""
    monitor = config.monitor
    names = [name for name, enabled in (("tensorboard", monitor.tensorboard), ("wandb", monitor.wandb),
                                        ("swanlab", monitor.swanlab)) if enabled]
    return names or None


def workflow_args(config: AgentTuneConfig, paths: TrinityPaths) -> dict[str, Any]:
    """What the Trinity workflow needs to rebuild the agenttune side in its own process: the run
    directory (its config.yaml) and the config file's directory (workflow modules next to it)."""
    args = {"agenttune_run_dir": paths.run_dir}
    if config.source_dir is not None:
        args["agenttune_source_dir"] = str(config.source_dir)
    return args


def rollout_args(config: AgentTuneConfig, *, validation: bool = False) -> dict[str, Any]:
    rollout = config.rollout
    return {
        "temperature": rollout.val_temperature if validation else rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "max_tokens": rollout.max_response_length_in_one_turn,
    }


def train_taskset(config: AgentTuneConfig, paths: TrinityPaths) -> dict[str, Any]:
    return {
        "name": TRAIN_TASKSET,
        "storage_type": "file",
        "path": paths.tasks,
        "split": "train",
        "default_workflow_type": WORKFLOW_TYPE,
        "workflow_args": workflow_args(config, paths),
        "rollout_args": rollout_args(config),
        "data_selector": {"selector_type": "shuffle" if config.data.shuffle else "sequential",
                          "seed": config.trainer.seed},
    }


def validates(config: AgentTuneConfig) -> bool:
    trainer = config.trainer
    return config.task_reader.validation_split is not None and (trainer.test_freq > 0 or trainer.val_before_train)


def eval_tasksets(config: AgentTuneConfig, paths: TrinityPaths) -> list[dict[str, Any]] | None:
    if not validates(config):
        return None
    return [{
        "name": VALIDATION_TASKSET,
        "storage_type": "file",
        "path": paths.tasks,
        "split": "validation",
        "repeat_times": 1,
        "default_workflow_type": WORKFLOW_TYPE,
        "workflow_args": workflow_args(config, paths),
        "rollout_args": rollout_args(config, validation=True),
    }]


def lr_scheduler(config: AgentTuneConfig) -> str:
    schedule = config.trainer.lr_schedule
    if schedule not in ("constant", "cosine"):
        raise UserError(f"trainer.lr_schedule = {schedule!r} is not available with the trinity backbone: "
                        "Trinity-RFT's FSDP trainer (verl) schedules 'constant' or 'cosine'.",
                        hint="Set trainer.lr_schedule to constant or cosine.")
    return schedule


# agenttune's policy loss -> Trinity-RFT 0.6.0's policy_loss_fn (the first three take clip_range_low/high;
# importance_sampling, -A_t r_t unclipped, is what Trinity's on-policy distillation trains with)
TRINITY_LOSSES = {"ppo_clip": "ppo", "gspo": "gspo", "cispo": "cispo", "distillation": "importance_sampling"}
CLIPPED_LOSSES = ("ppo_clip", "gspo", "cispo")


def algorithm_type(config: AgentTuneConfig) -> str:
    if config.algorithm.policy_loss == "distillation":
        check_distillation(config)
        return "on_policy_distill"
    return grpo_algorithm(config)


def grpo_algorithm(config: AgentTuneConfig) -> str:
    algorithm = config.algorithm
    if algorithm.adv_estimator != "grpo":
        raise UserError(
            f"algorithm.adv_estimator = {algorithm.adv_estimator!r} is not available with the trinity backbone: "
            "agenttune hands Trinity-RFT an agent episode as one or more samples, and only its multi_step_grpo "
            "advantage (step_wise_grpo) takes each episode's reward once and gives all its samples the same "
            "advantage; Trinity's rloo and reinforceplusplus advantages count every sample as an episode.",
            hint="Use algorithm.adv_estimator: grpo with --backbone trinity, or train this estimator with "
                 "--backbone local or verl.")
    if not algorithm.norm_adv_by_std or algorithm.estimator_options.get("norm_by_std") is False:
        key = "algorithm.norm_adv_by_std" if not algorithm.norm_adv_by_std else "algorithm.estimator_options.norm_by_std"
        raise UserError(f"{key} = false is not available with the trinity backbone: "
                        "Trinity-RFT's GRPO always divides group-centred rewards by the group's std.",
                        hint=f"Remove {key}, or set trinity.algorithm.advantage_fn "
                             "to another of Trinity's advantage functions.")
    # An agent episode can become several samples (a rewritten history starts a new one). Multi-step
    # GRPO groups by task, takes each run's reward once, and broadcasts its advantage to every sample
    # of the run; with one sample per episode it is plain GRPO.
    return "multi_step_grpo"


def policy_loss_fn(config: AgentTuneConfig) -> str:
    algorithm = config.algorithm
    if algorithm.policy_loss not in TRINITY_LOSSES:
        raise UserError(f"algorithm.policy_loss = {algorithm.policy_loss!r} has no equivalent among Trinity-RFT's "
                        "policy losses.",
                        hint=f"Use one of {', '.join(TRINITY_LOSSES)} with --backbone trinity, or --backbone local.")
    # overlong_shaping needs no translation: the workflow shapes the rewards it hands Trinity (experiences.py)
    for name, on in (("dynamic_sampling.enable", algorithm.dynamic_sampling.enable),
                     ("zero_variance_groups: drop", algorithm.zero_variance_groups == "drop")):
        if on:
            raise UserError(f"algorithm.{name} is not translated for the trinity backbone: agenttune does not yet "
                            "map it onto Trinity-RFT's sample strategies and reward shaping.",
                            hint="Turn it off for --backbone trinity, or use --backbone local (or verl, which has "
                                 "dynamic sampling as filter_groups).")
    return TRINITY_LOSSES[algorithm.policy_loss]


def clip_range(config: AgentTuneConfig, bound: float) -> float | None:
    """The clip bound for the clipped losses; none for importance_sampling, whose constructor takes none."""
    return bound if config.algorithm.policy_loss in CLIPPED_LOSSES else None


# -- on-policy distillation (algorithm.policy_loss: distillation) -----------------------------------
# agenttune (losses/distillation.py) trains each token on A_t = log π_teacher(t) - log π_old(t)
# (+ reward_weight x the estimator's advantage), loss -A_t r_t with r_t = π_θ / π_old, no clip.
# Trinity-RFT 0.6.0's `on_policy_distill` algorithm computes A_t = kl_coef x (teacher_logprobs -
# old_log_probs) in its trainer (advantage_fn on_policy_distill) and `importance_sampling` trains
# -A_t r_t unclipped (its log-ratio clamped to ±20); kl_coef 1 is agenttune's rule
# (plugins/trinity/tests/test_distillation.py runs both on one batch). Trinity takes π_old from the
# rollout engine's log-probs (algorithm.bypass_old_logprobs, its default and the only path it
# validates), as it does for every algorithm here; agenttune's local backbone recomputes them unless
# rollout_correction.bypass_mode: the same numbers up to the engine's numerical mismatch. The teacher
# is Trinity's first auxiliary model (a vLLM engine on its own GPU); agenttune's workflow fills
# `Experience.teacher_logprobs` from it (teacher.py), scoring at rollout.temperature as agenttune's
# hf teacher does.
TEACHER_GPUS = 1  # one vLLM engine, tensor parallel 1; trinity.explorer.auxiliary_models overrides it


def distillation_options(config: AgentTuneConfig) -> Any:
    """The distillation loss's options, validated (teacher, teacher_engine, reward_weight, ...)."""
    from pydantic import ValidationError

    from agenttune.plugin_api import get_component

    try:
        return get_component("policy_losses", "distillation").Options.model_validate(
            config.algorithm.policy_loss_options)
    except ValidationError as error:
        raise UserError(f"Invalid algorithm.policy_loss_options for 'distillation': {error.errors()[0]['msg']}.",
                        hint="See the 'distillation' options in docs/local.md (Objectives).") from None


def teacher_gpus(config: AgentTuneConfig) -> int:
    return TEACHER_GPUS if config.algorithm.policy_loss == "distillation" else 0


def check_distillation(config: AgentTuneConfig) -> None:
    """Refuse, in one paragraph, what of agenttune's distillation Trinity-RFT 0.6.0 cannot run as the same rule."""
    options = distillation_options(config)
    local = "or train this objective with --backbone local"
    # hf and vllm both name a teacher directory: Trinity serves it as an auxiliary vLLM model.
    if options.teacher_engine == "openai":
        raise UserError(
            f"algorithm.policy_loss_options.teacher_engine={options.teacher_engine!r} has no equivalent in "
            "Trinity-RFT 0.6.0: its distillation teacher is an auxiliary model it serves itself, and its external "
            "(OpenAI API) engine cannot return the prompt log-probs the teacher must give.",
            hint=f"Set policy_loss_options.teacher to the teacher's model directory (teacher_engine: hf), {local}.")
    if options.teacher_engine_options:
        raise UserError(
            "algorithm.policy_loss_options.teacher_engine_options set up agenttune's own vLLM teacher; Trinity-RFT "
            "0.6.0 serves the teacher as an auxiliary model of its own and would not read them.",
            hint="Drop teacher_engine_options (Trinity gives the teacher one GPU), or train this objective with "
                 "--backbone local.")
    if str(options.teacher).startswith("tiny://"):
        raise UserError(
            f"algorithm.policy_loss_options.teacher={options.teacher!r}: Trinity's vLLM teacher loads real model "
            "directories, not agenttune's tiny:// test models.",
            hint="Write one with `agenttune model init-tiny DIR` and set the teacher to DIR.")
    if options.reward_weight:
        raise UserError(
            f"algorithm.policy_loss_options.reward_weight={options.reward_weight:g} has no equivalent in Trinity-RFT "
            "0.6.0: its on_policy_distill advantage is the teacher's log-prob minus the student's alone, with no "
            "task reward added.",
            hint=f"Use reward_weight 0 (pure distillation) with --backbone trinity, use --backbone verl (reward_weight "
                 f"1), {local}.")
    if config.algorithm.kl_coef > 0:
        raise UserError(
            f"algorithm.kl_coef={config.algorithm.kl_coef:g} with policy_loss distillation has no equivalent in "
            "Trinity-RFT 0.6.0: its on_policy_distill algorithm runs no reference model, so there is no KL term.",
            hint=f"Set algorithm.kl_coef: 0 for distillation on Trinity, {local}.")
    gpus = total_gpus(config)
    if 0 < gpus < 3:
        raise UserError(
            f"policy_loss distillation needs at least 3 GPUs with the trinity backbone, and "
            f"trainer.n_gpus_per_node x trainer.nnodes is {gpus}: Trinity-RFT serves the teacher as an auxiliary "
            "model on its own GPU beside at least one rollout engine and one training GPU, and its one-GPU "
            "(colocate) mode takes no auxiliary model.",
            hint=f"Give the run 3 or more GPUs, {local}.")


def auxiliary_models(config: AgentTuneConfig) -> list[dict[str, Any]] | None:
    if config.algorithm.policy_loss != "distillation":
        return None
    return [{"model_path": distillation_options(config).teacher, "engine_type": "vllm", "engine_num": 1,
             "tensor_parallel_size": TEACHER_GPUS, "dtype": rollout_dtype(config), "seed": config.trainer.seed}]


def advantage_kl_coef(config: AgentTuneConfig) -> float | None:
    # A_t = kl_coef x (log π_teacher - log π_old): agenttune's reverse-KL advantage has coefficient 1.
    return 1.0 if config.algorithm.policy_loss == "distillation" else None


def loss_agg_mode(config: AgentTuneConfig) -> str:
    """GSPO is defined with a per-sequence mean (as agenttune's gspo and Trinity's own default)."""
    return "seq-mean-token-mean" if config.algorithm.policy_loss == "gspo" else config.algorithm.loss_agg_mode


# -- rollout correction (algorithm.rollout_correction) -----------------------------------------------
# Trinity-RFT 0.6.0 (on verl >= 0.8, its engine-based trainer) always takes π_old from the rollout
# engine's log-probs (`algorithm.bypass_old_logprobs`, its default; the recomputing path is marked
# unvalidated), so its PPO-style losses clip the ratio π_θ / π_rollout: agenttune's
# `bypass_mode: true, loss_type: ppo_clip`, which is translated. Its `algorithm.rollout_correction` is
# handed to verl's actor config, where only verl's own `bypass_mode` loss reads it; Trinity replaces
# that loss with its own policy losses (trainer/verl/losses.py), which take no importance weights and
# no rejection mask, and its train step leaves rollout correction as a TODO. So importance weights
# (rollout_is, also the asynchronous modes' default TIS), rejection (rollout_rs) and REINFORCE
# (loss_type reinforce) would be silently dropped: refused.
def bypass_old_logprobs(config: AgentTuneConfig) -> bool | None:
    """True for agenttune's bypass mode (Trinity's own rule, said explicitly); None: Trinity's default."""
    correction = config.algorithm.rollout_correction
    check_rollout_correction(config)
    return True if correction.bypass_mode else None


def check_rollout_correction(config: AgentTuneConfig) -> None:
    correction = config.algorithm.rollout_correction
    if correction.rollout_rs is not None:
        key, value, what = "rollout_rs", correction.rollout_rs, "rejection sampling"
    elif correction.rollout_is is not None:
        key, value, what = "rollout_is", correction.rollout_is, "importance weights"
    else:
        return
    default = ""
    if config.trainer.staleness_bound:
        default = (f" trainer.mode={config.trainer.mode!r} uses token-level truncated importance sampling "
                   "(rollout_is: token, threshold 2.0) by default when algorithm.rollout_correction is not set.")
    raise UserError(
        f"algorithm.rollout_correction.{key}={value!r} ({what}) has no equivalent in Trinity-RFT 0.6.0: its "
        "trainer takes π_old from the rollout engine's log-probs and its policy losses read neither importance "
        "weights nor rejection masks (its algorithm.rollout_correction reaches only verl's own loss, which "
        "Trinity replaces), so the correction would be silently dropped." + default,
        hint="For --backbone trinity set algorithm.rollout_correction: {bypass_mode: true} (Trinity's own rule: "
             "PPO's ratio to the engine's log-probs, clipped; the same as agenttune's bypass mode with "
             "loss_type ppo_clip), or train with this correction on --backbone local or verl.")


# -- asynchronous training (trainer.mode, trainer.max_staleness) -------------------------------------
def sync_style(config: AgentTuneConfig) -> str:
    """sync and one_step_off: Trinity's `fixed` schedule (one_step_off with `sync_offset: 1`); async:
    `fully_async` — the explorer rolls out continuously and pulls new weights after every step."""
    if config.trainer.mode != "async":
        return "fixed"
    if validates(config):
        raise UserError(
            "trainer.mode = 'async' cannot validate with the trinity backbone: Trinity-RFT 0.6's fully "
            "asynchronous schedule (synchronizer.sync_style: fully_async) refuses evaluation tasksets, and "
            "task_reader.validation_split with trainer.test_freq or trainer.val_before_train asks for them.",
            hint="Use trainer.mode=one_step_off (Trinity's sync_offset 1, which validates), or turn validation "
                 "off (trainer.test_freq=0, trainer.val_before_train=false) for the asynchronous run.")
    return "fully_async"


def sync_offset(config: AgentTuneConfig) -> int:
    # The explorer runs this many steps ahead of the weights it samples from: one-step off-policy.
    return 1 if config.trainer.mode == "one_step_off" else 0


def staleness_strategy(config: AgentTuneConfig) -> str | None:
    """async: Trinity's `staleness_control` sampler keeps experiences whose model version lags the
    weights being trained by at most `max_staleness` (older ones are skipped). The fixed schedules
    bound staleness by construction (their explorer waits for the sync), so Trinity's default stays:
    a filter there could starve a trainer whose explorer is waiting for it."""
    return "staleness_control" if config.trainer.mode == "async" else None


def max_staleness(config: AgentTuneConfig) -> int | None:
    # Trinity keeps experiences of model version >= step - max_staleness - 1 when training step `step`
    # (1-based): the version being trained minus the experience's is at most max_staleness, as in agenttune.
    return config.trainer.max_staleness if config.trainer.mode == "async" else None


def inflight_batches(config: AgentTuneConfig) -> int | None:
    """async: batches rolling out at once, the one being trained plus `max_staleness` ahead (agenttune's
    admission rule). Trinity reads it only in the fully_async style."""
    return config.trainer.max_staleness + 1 if config.trainer.mode == "async" else None


def _t(trinity_key: str, source: str, value: Value) -> Translation:
    return Translation(trinity_key, source, value)


TRANSLATIONS: tuple[Translation, ...] = (
    # the job
    _t("mode", "trainer.n_gpus_per_node × trainer.nnodes (1 GPU: colocate, else both; Tinker mode: both)", lambda c, p: mode(c)),
    _t("project", "project_name", lambda c, p: c.project_name),
    _t("name", "experiment_name", lambda c, p: c.experiment_name),
    _t("checkpoint_root_dir", "the run directory (<run_dir>/checkpoints)", lambda c, p: p.checkpoints),
    _t("continue_from_checkpoint", "(always: a fresh run directory has none; --resume reuses one)",
       lambda c, p: True),
    # Trinity names its Ray actors ("explorer", "trainer", ...) inside this namespace: one per run, so two
    # runs of one experiment on a shared cluster never meet.
    _t("ray_namespace", "project_name/experiment_name/<run directory name>",
       lambda c, p: f"{c.project_name}/{c.experiment_name}/{p.run_name}"),
    # model
    _t("model.model_path", "model.path (tiny:// resolved to its directory)", lambda c, p: p.model),
    _t("model.trust_remote_code", "model.trust_remote_code", lambda c, p: c.model.trust_remote_code),
    _t("model.max_model_len", "model.max_model_len", lambda c, p: c.model.max_model_len),
    _t("model.max_response_tokens", "rollout.max_response_length_in_one_turn",
       lambda c, p: c.rollout.max_response_length_in_one_turn),
    _t("model.enable_prompt_truncation", "(off: the gateway reports context overflow to the workflow)",
       lambda c, p: False),
    _t("model.temperature", "rollout.temperature", lambda c, p: c.rollout.temperature),
    _t("model.top_p", "rollout.top_p", lambda c, p: c.rollout.top_p),
    _t("model.top_k", "rollout.top_k", lambda c, p: c.rollout.top_k),
    # cluster (0 GPUs per node, or Tinker mode: left to Trinity, which asks Ray)
    _t("cluster.node_num", "trainer.nnodes", lambda c, p: c.trainer.nnodes if gpu_cluster(c) else None),
    _t("cluster.gpu_per_node", "trainer.n_gpus_per_node", lambda c, p: c.trainer.n_gpus_per_node if gpu_cluster(c)
       else None),
    # algorithm: GRPO, group size = num_repeat
    _t("algorithm.algorithm_type", "algorithm.adv_estimator (grpo → multi_step_grpo); policy_loss distillation → "
       "on_policy_distill", lambda c, p: algorithm_type(c)),
    _t("algorithm.advantage_fn_args.kl_coef", "(distillation only: 1, agenttune's reverse-KL advantage)",
       lambda c, p: advantage_kl_coef(c)),
    _t("algorithm.repeat_times", "rollout.num_repeat", lambda c, p: c.rollout.num_repeat),
    _t("algorithm.policy_loss_fn", "algorithm.policy_loss (ppo_clip → ppo, gspo, cispo; distillation → "
       "importance_sampling)", lambda c, p: policy_loss_fn(c)),
    _t("algorithm.policy_loss_fn_args.clip_range_low", "algorithm.clip_ratio_low (not for distillation)",
       lambda c, p: clip_range(c, c.algorithm.clip_ratio_low)),
    _t("algorithm.policy_loss_fn_args.clip_range_high", "algorithm.clip_ratio_high (not for distillation)",
       lambda c, p: clip_range(c, c.algorithm.clip_ratio_high)),
    _t("algorithm.loss_agg_mode", "algorithm.loss_agg_mode (gspo: seq-mean-token-mean)", lambda c, p: loss_agg_mode(c)),
    _t("algorithm.kl_penalty_fn", "(none: KL goes into the loss)", lambda c, p: "none"),
    _t("algorithm.kl_loss_fn", "algorithm.kl_estimator (none when algorithm.kl_coef is 0)", lambda c, p: kl_loss(c)),
    _t("algorithm.kl_loss_fn_args.kl_coef", "algorithm.kl_coef", lambda c, p: c.algorithm.kl_coef),
    _t("algorithm.entropy_loss_fn", "(none, as in the local backbone)", lambda c, p: "none"),
    _t("algorithm.bypass_old_logprobs", "algorithm.rollout_correction.bypass_mode (true: π_old is the engine's "
       "log-probs, Trinity's own rule); rollout_is, rollout_rs refused", lambda c, p: bypass_old_logprobs(c)),
    _t("algorithm.optimizer.lr", "trainer.learning_rate", lambda c, p: c.trainer.learning_rate),
    _t("algorithm.optimizer.lr_scheduler_type", "trainer.lr_schedule (constant, cosine)", lambda c, p: lr_scheduler(c)),
    _t("algorithm.optimizer.lr_warmup_steps", "trainer.warmup_steps", lambda c, p: c.trainer.warmup_steps),
    _t("algorithm.optimizer.weight_decay", "trainer.weight_decay", lambda c, p: c.trainer.weight_decay),
    _t("algorithm.optimizer.clip_grad", "trainer.grad_clip", lambda c, p: c.trainer.grad_clip),
    # buffer: the taskset written from the agenttune task reader, with the rollout args
    _t("buffer.batch_size", "data.train_batch_size", lambda c, p: c.data.train_batch_size),
    _t("buffer.train_batch_size", "data.train_batch_size × rollout.num_repeat",
       lambda c, p: c.data.train_batch_size * c.rollout.num_repeat),
    _t("buffer.total_epochs", "trainer.total_epochs", lambda c, p: c.trainer.total_epochs),
    _t("buffer.total_steps", "trainer.total_steps", lambda c, p: c.trainer.total_steps),
    _t("buffer.explorer_input.taskset",
       "task_reader (train_split → <run_dir>/trinity/tasks/train.jsonl), rollout.temperature/top_p/top_k/"
       "max_response_length_in_one_turn, data.shuffle, trainer.seed", train_taskset),
    _t("buffer.explorer_input.eval_tasksets",
       "task_reader.validation_split (→ validation.jsonl), rollout.val_temperature; only when validating",
       eval_tasksets),
    # explorer: vLLM rollout engines behind an OpenAI API (the gateway sends it prompt token ids)
    _t("explorer.rollout_model.engine_type", "(vllm; Tinker mode: tinker)",
       lambda c, p: "tinker" if tinker_mode(c) else "vllm"),
    _t("explorer.rollout_model.engine_num", "(trainer.n_gpus_per_node × trainer.nnodes − the teacher's GPU) ÷ 2 "
       "(colocate: 1)", lambda c, p: rollout_engines(c)),
    _t("explorer.rollout_model.tensor_parallel_size", "(1; set trinity.explorer.rollout_model.… for more)",
       lambda c, p: 1),
    _t("explorer.rollout_model.enable_openai_api", "(on: the gateway's engine calls /v1/completions)",
       lambda c, p: True),
    _t("explorer.rollout_model.enable_history", "(off: experiences come from the gateway's timeline)",
       lambda c, p: False),
    _t("explorer.rollout_model.dtype", "model.dtype (auto → bfloat16)", lambda c, p: rollout_dtype(c)),
    _t("explorer.rollout_model.seed", "trainer.seed", lambda c, p: c.trainer.seed),
    _t("explorer.auxiliary_models", "algorithm.policy_loss_options.teacher (distillation: the teacher, one vLLM "
       "engine on one GPU)", lambda c, p: auxiliary_models(c)),
    _t("explorer.runner_per_model", "rollout.max_env_worker ÷ rollout.num_repeat", lambda c, p: runners_per_engine(c)),
    _t("explorer.max_timeout", "rollout.episode_timeout + judge.timeout (+60 s; × rounds when num_repeat > "
       "max_env_worker)", lambda c, p: task_timeout(c)),
    _t("explorer.eval_interval", "trainer.test_freq (0: never during training)",
       lambda c, p: c.trainer.test_freq or NEVER),
    _t("explorer.eval_on_startup", "trainer.val_before_train", lambda c, p: c.trainer.val_before_train),
    # trainer (verl FSDP2, inside Trinity)
    _t("trainer.trainer_type", "(verl; Tinker mode: tinker)",
       lambda c, p: "tinker" if tinker_mode(c) else "verl"),
    _t("trainer.save_interval", "trainer.save_freq (0: only the final checkpoint)", lambda c, p: c.trainer.save_freq),
    _t("trainer.save_hf_checkpoint", "(last: the final model as a Hugging Face checkpoint)", lambda c, p: "last"),
    _t("trainer.grad_clip", "trainer.grad_clip", lambda c, p: c.trainer.grad_clip),
    _t("trainer.total_steps", "trainer.total_steps", lambda c, p: c.trainer.total_steps),
    # synchronizer: weights go to the rollout engines after every step; trainer.mode picks the schedule
    _t("synchronizer.sync_method", "(nccl; colocate: memory, chosen by Trinity; Tinker mode: checkpoint)",
       lambda c, p: "checkpoint" if tinker_mode(c) else "nccl"),
    _t("synchronizer.sync_style", "trainer.mode (sync, one_step_off: fixed; async: fully_async)",
       lambda c, p: sync_style(c)),
    _t("synchronizer.sync_interval", "(1: every step, as the local backbone)", lambda c, p: 1),
    _t("synchronizer.sync_offset", "trainer.mode (one_step_off: 1, else 0)", lambda c, p: sync_offset(c)),
    _t("explorer.max_inflight_batches", "trainer.max_staleness + 1 (async only)", lambda c, p: inflight_batches(c)),
    _t("algorithm.sample_strategy", "trainer.mode (async: staleness_control; else Trinity's default)",
       lambda c, p: staleness_strategy(c)),
    _t("algorithm.sample_strategy_args.max_staleness", "trainer.max_staleness (async only)",
       lambda c, p: max_staleness(c)),
    # monitor: Trinity's metrics also go to <run_dir>/metrics.jsonl
    _t("monitor.monitor_type", "(agenttune's monitor: metrics.jsonl, then the one below)", lambda c, p: MONITOR_TYPE),
    _t("monitor.monitor_args.metrics_file", "the run directory (<run_dir>/metrics.jsonl)", lambda c, p: p.metrics_file),
    _t("monitor.monitor_args.inner", "monitor.tensorboard / monitor.wandb / monitor.swanlab (every one enabled)",
       lambda c, p: monitor_inner(c)),
)


def generated_config(config: AgentTuneConfig, paths: TrinityPaths) -> dict[str, Any]:
    """The table applied to `config`, as a nested dict (no passthrough)."""
    native: dict[str, Any] = {}
    for row in TRANSLATIONS:
        value = row.value(config, paths)
        if value is not None:
            set_path(native, row.trinity_key, value)
    return native


def trinity_config(config: AgentTuneConfig, paths: TrinityPaths) -> dict[str, Any]:
    """Trinity's config for `config`: the table, then the `trinity:` section merged over it."""
    return deep_merge(generated_config(config, paths), config.section("trinity", TrinityOptions).root)


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`: mappings merge key by key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def markdown_table() -> str:
    """The translation table for the README."""
    lines = ["| Trinity-RFT key | from agenttune |", "| --- | --- |"]
    lines += [f"| `{row.trinity_key}` | {row.source} |" for row in TRANSLATIONS]
    return "\n".join(lines)
