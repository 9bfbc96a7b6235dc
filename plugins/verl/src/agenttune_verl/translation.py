"""agenttune's configuration, translated into verl's.

`TRANSLATIONS` is the one table of what agenttune sets in verl's config: each row names the verl key
and computes its value from the agenttune config (and, for file locations, the run's paths). Every key
in the table exists in verl 0.9.1's own Hydra config (`verl/trainer/config/ppo_trainer.yaml` and the
files it composes); the tests check that. The `verl:` section of the agenttune config is applied
afterwards, verbatim, so it can override anything here (see `verl_config.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agenttune.plugin_api import AgentTuneConfig
from agenttune_verl import objectives
from agenttune_verl.policies import one_policy

AGENT_LOOP_NAME = "agenttune"

# agenttune's save_freq 0 means "only at the end". verl saves when `save_freq > 0` and the step is the
# last one or a multiple of save_freq, so a period longer than any run saves exactly at the end.
SAVE_ONLY_AT_END = 1_000_000_000

# verl's default token budget per GPU for dynamic batching; raised when one sequence is longer.
VERL_DEFAULT_MAX_TOKEN_LEN_PER_GPU = 16384


@dataclass(frozen=True)
class VerlPaths:
    """Where a run's files live; `placeholder()` is what `config show` prints before a run exists."""

    train_files: str
    val_files: str
    agent_loop_config: str
    checkpoints: str

    @classmethod
    def for_run(cls, run_dir: Path, *, has_validation: bool) -> VerlPaths:
        return cls._layout(str(run_dir.resolve()), has_validation)

    @classmethod
    def placeholder(cls, config: AgentTuneConfig) -> VerlPaths:
        return cls._layout("<run_dir>", config.task_reader.validation_split is not None)

    @classmethod
    def _layout(cls, run_dir: str, has_validation: bool) -> VerlPaths:
        train = f"{run_dir}/verl/train.parquet"
        return cls(
            train_files=train,
            # verl always builds a validation dataset; without a validation split it reads the train
            # file and is never asked to validate (test_freq -1, val_before_train False).
            val_files=f"{run_dir}/verl/validation.parquet" if has_validation else train,
            agent_loop_config=f"{run_dir}/verl/agent_loops.yaml",
            checkpoints=f"{run_dir}/checkpoints",
        )


Value = Callable[[AgentTuneConfig, VerlPaths], Any]


class _VerlDefault:
    """A row's value for configs it does not apply to: verl's own default stays (see `translated_values`)."""

    def __repr__(self) -> str:
        return "VERL_DEFAULT"


VERL_DEFAULT = _VerlDefault()


@dataclass(frozen=True)
class Translation:
    verl_key: str
    source: str  # the agenttune key(s) it comes from, for the docs and `--help`-style tables
    value: Value


def _loggers(config: AgentTuneConfig) -> list[str]:
    # "file" writes verl's per-step metrics as JSON lines; the launcher turns them into metrics.jsonl.
    loggers = ["console", "file"]
    monitor = config.monitor
    loggers += [name for name, on in (("tensorboard", monitor.tensorboard), ("wandb", monitor.wandb),
                                      ("swanlab", monitor.swanlab)) if on]
    return loggers


def _max_token_len_per_gpu(config: AgentTuneConfig) -> int:
    one_sequence = sum(config.data.length_limits())
    return max(VERL_DEFAULT_MAX_TOKEN_LEN_PER_GPU, one_sequence)


def _rollout_dtype(config: AgentTuneConfig) -> str:
    return "bfloat16" if config.model.dtype == "auto" else config.model.dtype


# agenttune's trainer.mode -> verl 0.9.1's V1 trainer mode (`trainer.v1.trainer_mode`, read by
# `verl.trainer.main_ppo`, the entry point agenttune launches). colocate_async keeps rollout and
# training on the same GPUs, continues unfinished episodes after each weight update (partial
# rollouts) and trains the first complete groups: agenttune's asynchronous schedule. verl's
# separate_async (its own rollout GPUs) is one `verl:` override away (see the README).
VERL_TRAINER_MODES = {"sync": "sync", "one_step_off": "colocate_async", "async": "colocate_async"}


def _off_policy_threshold(config: AgentTuneConfig) -> int | None:
    """verl bounds how many model versions a group may *span* (the step it was fed at through the step
    that trains it, both counted); agenttune bounds how many versions a token may *lag*: span = lag + 1.
    None (synchronous): verl's version control off, as its sync sampler ignores it anyway."""
    bound = config.trainer.staleness_bound
    return None if bound is None else bound + 1


def _warmup_batches(config: AgentTuneConfig) -> int:
    """Batches fed before the first step: the async window, as agenttune's admission rule (rollouts run
    at most `max_staleness` batches ahead of training). Synchronous: none."""
    return config.trainer.staleness_bound or 0


def _policy(option: str) -> Value:
    """An option of the one policy's adapter (policies.py): verl's LoRA; verl's default without policies."""
    def value(config: AgentTuneConfig, paths: VerlPaths) -> Any:
        single = one_policy(config)
        return VERL_DEFAULT if single is None else getattr(single[1], option)
    return value


def _learning_rate(config: AgentTuneConfig) -> float:
    single = one_policy(config)
    own = None if single is None else single[1].learning_rate
    return config.trainer.learning_rate if own is None else own


def _distillation(verl_key: str) -> Value:
    """A key of verl's `distillation` section: set only for `policy_loss: distillation` (objectives.py)."""
    return lambda c, p: objectives.distillation_values(c).get(verl_key, VERL_DEFAULT)


def _t(verl_key: str, source: str, value: Value) -> Translation:
    """One row: the verl key, where its value comes from (for people), how to compute it."""
    return Translation(verl_key, source, value)


def _correction_option(name: str) -> Value:
    """algorithm.rollout_correction.<name>: verl's option names are agenttune's."""
    return lambda c, p: getattr(c.algorithm.rollout_correction, name)


TRANSLATIONS: tuple[Translation, ...] = (
    # algorithm: the estimator and loss (objectives.py), group size = num_repeat
    _t("algorithm.adv_estimator", "algorithm.adv_estimator (dr_grpo → grpo)", lambda c, p: objectives.adv_estimator(c)),
    _t("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std (dr_grpo: false)",
       lambda c, p: objectives.norm_adv_by_std(c)),
    _t("actor_rollout_ref.actor.policy_loss.loss_mode", "algorithm.policy_loss (ppo_clip → vanilla)",
       lambda c, p: objectives.loss_mode(c)),
    _t("algorithm.filter_groups.enable", "algorithm.dynamic_sampling.enable",
       lambda c, p: c.algorithm.dynamic_sampling.enable),
    _t("algorithm.filter_groups.metric", "(always reward: groups without reward spread)", lambda c, p: "reward"),
    _t("algorithm.filter_groups.max_num_gen_batches", "algorithm.dynamic_sampling.max_retries + 1",
       lambda c, p: objectives.max_num_gen_batches(c)),
    _t("algorithm.use_kl_in_reward", "(always false: KL goes into the loss)", lambda c, p: False),
    _t("critic.enable", "(always false: GRPO has no critic)", lambda c, p: False),
    _t("actor_rollout_ref.actor.use_kl_loss", "algorithm.kl_coef > 0", lambda c, p: c.algorithm.kl_coef > 0),
    _t("actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_coef", lambda c, p: c.algorithm.kl_coef),
    _t("actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_estimator",
       lambda c, p: c.algorithm.kl_estimator),
    _t("actor_rollout_ref.actor.clip_ratio_low", "algorithm.clip_ratio_low",
       lambda c, p: c.algorithm.clip_ratio_low),
    _t("actor_rollout_ref.actor.clip_ratio_high", "algorithm.clip_ratio_high",
       lambda c, p: c.algorithm.clip_ratio_high),
    _t("actor_rollout_ref.actor.loss_agg_mode", "algorithm.loss_agg_mode (gspo: seq-mean-token-mean)",
       lambda c, p: objectives.loss_agg_mode(c)),
    # on-policy distillation (policy_loss: distillation only; objectives.py says why this is the same rule)
    *(_t(key, source, _distillation(key)) for key, source in (
        ("distillation.enabled", "algorithm.policy_loss: distillation"),
        ("distillation.distillation_loss.loss_mode", "(distillation: always k1, log π_student - log π_teacher)"),
        ("distillation.distillation_loss.use_policy_gradient", "(distillation: always true, -k1 is the advantage)"),
        ("distillation.distillation_loss.use_task_rewards", "policy_loss_options.reward_weight (0: false, 1: true)"),
        ("distillation.distillation_loss.distillation_loss_coef", "(distillation: always 1)"),
        ("distillation.distillation_loss.loss_max_clamp", "(distillation: always null, no clamp)"),
        ("distillation.teacher_models.teacher_model.model_path", "policy_loss_options.teacher"),
        ("distillation.n_gpus_per_node", "trainer.n_gpus_per_node (the teacher's own GPUs; nnodes: verl: section)"),
        ("distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size",
         "min(2, trainer.n_gpus_per_node)"),
    )),
    # rollout correction: the same option names on both sides (agenttune took verl's)
    *(_t(f"algorithm.rollout_correction.{name}", f"algorithm.rollout_correction.{name}", _correction_option(name))
      for name in ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                   "rollout_rs_threshold", "bypass_mode", "loss_type")),
    # model
    _t("actor_rollout_ref.model.path", "model.path", lambda c, p: c.model.path),
    _t("actor_rollout_ref.model.tokenizer_path", "model.tokenizer", lambda c, p: c.model.tokenizer),
    _t("actor_rollout_ref.model.trust_remote_code", "model.trust_remote_code",
       lambda c, p: c.model.trust_remote_code),
    _t("data.trust_remote_code", "model.trust_remote_code", lambda c, p: c.model.trust_remote_code),
    # one policy (policies.py): verl's LoRA, merged into the base weights before each weight sync
    _t("actor_rollout_ref.model.lora_rank", "policies.adapters.NAME.rank", _policy("rank")),
    _t("actor_rollout_ref.model.lora_alpha", "policies.adapters.NAME.alpha", _policy("alpha")),
    _t("actor_rollout_ref.model.target_modules", "policies.adapters.NAME.target_modules",
       _policy("target_modules")),
    _t("actor_rollout_ref.model.lora_adapter_path", "policies.adapters.NAME.init", _policy("init")),
    _t("actor_rollout_ref.model.lora.merge", "(with one policy, always true: the rollout serves merged weights)",
       lambda c, p: True if one_policy(c) else VERL_DEFAULT),
    # optimisation
    _t("actor_rollout_ref.actor.optim.lr", "policies.adapters.NAME.learning_rate, else trainer.learning_rate",
       lambda c, p: _learning_rate(c)),
    _t("actor_rollout_ref.actor.optim.lr_scheduler_type", "trainer.lr_schedule (constant, cosine)",
       lambda c, p: c.trainer.lr_schedule),
    _t("actor_rollout_ref.actor.optim.lr_warmup_steps", "trainer.warmup_steps",
       lambda c, p: c.trainer.warmup_steps),
    _t("actor_rollout_ref.actor.optim.weight_decay", "trainer.weight_decay",
       lambda c, p: c.trainer.weight_decay),
    _t("actor_rollout_ref.actor.optim.clip_grad", "trainer.grad_clip", lambda c, p: c.trainer.grad_clip),
    # one optimiser step per training step: a mini-batch is the whole batch of tasks
    _t("actor_rollout_ref.actor.ppo_mini_batch_size", "data.train_batch_size",
       lambda c, p: c.data.train_batch_size),
    _t("actor_rollout_ref.actor.use_dynamic_bsz", "(always true: micro-batches by token budget)",
       lambda c, p: True),
    _t("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
       "max(16384, data.max_prompt_length + data.max_response_length)", lambda c, p: _max_token_len_per_gpu(c)),
    _t("actor_rollout_ref.actor.data_loader_seed", "trainer.seed", lambda c, p: c.trainer.seed),
    # data
    _t("data.train_files", "(written by agenttune from task_reader.train_split)", lambda c, p: p.train_files),
    _t("data.val_files", "(written by agenttune from task_reader.validation_split)", lambda c, p: p.val_files),
    _t("data.train_batch_size", "data.train_batch_size", lambda c, p: c.data.train_batch_size),
    _t("data.max_prompt_length", "data.max_prompt_length", lambda c, p: c.data.max_prompt_length),
    _t("data.max_response_length", "data.max_response_length", lambda c, p: c.data.max_response_length),
    _t("data.shuffle", "data.shuffle", lambda c, p: c.data.shuffle),
    _t("data.seed", "trainer.seed", lambda c, p: c.trainer.seed),
    _t("data.return_raw_chat", "(always true: the agent loop reads the raw task)", lambda c, p: True),
    # the agent loop truncates (and counts) over-long prompts; verl must not drop rows silently
    _t("data.filter_overlong_prompts", "(always false)", lambda c, p: False),
    # rollout: async vLLM, one agenttune agent loop per row, num_repeat episodes per task
    _t("actor_rollout_ref.rollout.name", "(always vllm)", lambda c, p: "vllm"),
    _t("actor_rollout_ref.rollout.mode", "(always async)", lambda c, p: "async"),
    _t("actor_rollout_ref.rollout.n", "rollout.num_repeat", lambda c, p: c.rollout.num_repeat),
    _t("actor_rollout_ref.rollout.temperature", "rollout.temperature", lambda c, p: c.rollout.temperature),
    _t("actor_rollout_ref.rollout.top_p", "rollout.top_p", lambda c, p: c.rollout.top_p),
    _t("actor_rollout_ref.rollout.top_k", "rollout.top_k", lambda c, p: c.rollout.top_k),
    _t("actor_rollout_ref.rollout.val_kwargs.temperature", "rollout.val_temperature",
       lambda c, p: c.rollout.val_temperature),
    _t("actor_rollout_ref.rollout.val_kwargs.do_sample", "rollout.val_temperature > 0",
       lambda c, p: c.rollout.val_temperature > 0),
    _t("actor_rollout_ref.rollout.calculate_log_probs", "(always true: logprobs are recorded)", lambda c, p: True),
    _t("actor_rollout_ref.rollout.max_model_len", "model.max_model_len", lambda c, p: c.model.max_model_len),
    _t("actor_rollout_ref.rollout.dtype", "model.dtype (auto: bfloat16)", lambda c, p: _rollout_dtype(c)),
    _t("actor_rollout_ref.rollout.seed", "trainer.seed", lambda c, p: c.trainer.seed),
    _t("actor_rollout_ref.rollout.tensor_model_parallel_size", "min(2, trainer.n_gpus_per_node)",
       lambda c, p: min(2, c.trainer.n_gpus_per_node)),
    _t("actor_rollout_ref.rollout.agent.default_agent_loop", f"(always {AGENT_LOOP_NAME!r})",
       lambda c, p: AGENT_LOOP_NAME),
    _t("actor_rollout_ref.rollout.agent.agent_loop_config_path", "(written by agenttune)",
       lambda c, p: p.agent_loop_config),
    # trainer
    _t("trainer.project_name", "project_name", lambda c, p: c.project_name),
    _t("trainer.experiment_name", "experiment_name", lambda c, p: c.experiment_name),
    _t("trainer.total_epochs", "trainer.total_epochs", lambda c, p: c.trainer.total_epochs),
    _t("trainer.total_training_steps", "trainer.total_steps", lambda c, p: c.trainer.total_steps),
    _t("trainer.save_freq", "trainer.save_freq (0: only at the end)",
       lambda c, p: c.trainer.save_freq or SAVE_ONLY_AT_END),
    _t("trainer.test_freq", "trainer.test_freq (0: never)", lambda c, p: c.trainer.test_freq or -1),
    _t("trainer.val_before_train", "trainer.val_before_train", lambda c, p: c.trainer.val_before_train),
    _t("trainer.n_gpus_per_node", "trainer.n_gpus_per_node", lambda c, p: c.trainer.n_gpus_per_node),
    _t("trainer.nnodes", "trainer.nnodes", lambda c, p: c.trainer.nnodes),
    _t("trainer.logger", "monitor.tensorboard / wandb / swanlab (+ console, file)", lambda c, p: _loggers(c)),
    _t("trainer.default_local_dir", "(<run_dir>/checkpoints)", lambda c, p: p.checkpoints),
    _t("trainer.use_v1", "(always true: split timelines need the V1 trainer)", lambda c, p: True),
    # asynchronous training: verl's V1 trainer modes, in the same entry point (verl.trainer.main_ppo)
    _t("trainer.v1.trainer_mode", "trainer.mode (sync: sync; one_step_off, async: colocate_async)",
       lambda c, p: VERL_TRAINER_MODES[c.trainer.mode]),
    _t("trainer.v1.sampler.max_off_policy_threshold",
       "trainer.max_staleness + 1 (one_step_off: 2; sync: null)", lambda c, p: _off_policy_threshold(c)),
    _t("trainer.v1.sampler.max_off_policy_strategy", "(always drop: stale groups are dropped and counted)",
       lambda c, p: "drop"),
    _t("trainer.v1.colocate_async.num_warmup_batches", "trainer.max_staleness (one_step_off: 1; sync: 0)",
       lambda c, p: _warmup_batches(c)),
    _t("trainer.v1.separate_async.num_warmup_batches", "trainer.max_staleness (one_step_off: 1; sync: 0)",
       lambda c, p: _warmup_batches(c)),
    # verl asserts train_batch_size == parameter_sync_step x ppo_mini_batch_size (= train_batch_size here)
    _t("trainer.v1.separate_async.parameter_sync_step", "(always 1: weights reach the rollout after every step)",
       lambda c, p: 1),
)


def translated_values(config: AgentTuneConfig, paths: VerlPaths) -> dict[str, Any]:
    """`{verl dotted key: value}` for every row of the table that applies to this config."""
    values = {row.verl_key: row.value(config, paths) for row in TRANSLATIONS}
    return {key: value for key, value in values.items() if value is not VERL_DEFAULT}


def total_gpus(config: AgentTuneConfig) -> int:
    return config.trainer.n_gpus_per_node * config.trainer.nnodes


def markdown_table() -> str:
    """The translation table as Markdown (the plugin's README shows it; a test keeps them equal)."""
    lines = ["| verl key | from agenttune |", "| --- | --- |"]
    lines += [f"| `{row.verl_key}` | {row.source} |" for row in TRANSLATIONS]
    return "\n".join(lines)
