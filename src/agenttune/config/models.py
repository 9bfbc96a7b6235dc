"""The configuration: one YAML file, validated by these models.

Every field has a default and a description; `agenttune config schema` prints them as JSON schema and
docs/config.md is generated from them. Values come, lowest to highest priority, from the defaults,
the YAML file, `AGENTTUNE_…` environment variables (nested with `__`, e.g.
`AGENTTUNE_ROLLOUT__NUM_REPEAT=8`) and `key.path=value` command-line overrides (see config_loader).

Component sections (`task_reader`, `judge`, `engine`) take a `type` plus the options of that
component, which the component's own `Options` model validates (see `component_options`).
The other sections a component reads are its own: a backbone's `Options` is the section named
after it (`local:`, `debug:`), and plugins add sections through the `register_config_sections` hook
(`verl:`, `trinity:`, `ray:`, `agentscope:`). `config_loader.config_model()` adds them to this model
for the installed plugins; `AgentTuneConfig.section(name, Model)` reads one back.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agenttune.config.base import Section
from agenttune.config.correction_options import RolloutCorrectionOptions
from agenttune.config.objective_options import DynamicSamplingOptions, OverlongShapingOptions
from agenttune.config.policies import PoliciesConfig, check_policies
from agenttune.errors import UserError

SectionModel = TypeVar("SectionModel", bound=BaseModel)

MadnessCheck = Literal["nonsense", "wrong_toolcall"]

# Bounds that catch a typo'd extra digit before it becomes a hang (every episode of a step is
# created up front) or an allocation that cannot succeed. Far above any real run.
MAX_MODEL_LEN = 16 * 1024 * 1024  # tokens; the longest context windows are ~10M
MAX_REPEAT = 4096  # episodes per task per step
MAX_EPISODES_PER_STEP = 1_000_000  # train_batch_size x num_repeat, and episodes at once
MADNESS_CHECKS: tuple[MadnessCheck, ...] = ("nonsense", "wrong_toolcall")
# Seconds a task reader may take to produce its next task (a first download included) or to check its
# splits, before the run stops with an error instead of hanging (components/readers/deadline.py).
READ_TIMEOUT_S = 600.0


class ComponentSection(BaseModel):
    """A section that names a component by `type`; the other keys are that component's options.

    The options may also sit in a sub-section named after the type (ASTune's shape):
    `{type: huggingface, huggingface: {dataset_path: ...}}` reads as `{type: huggingface, dataset_path: ...}`.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _flatten_named_options(cls, data: Any) -> Any:
        return flatten_named_options(data)

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def flatten_named_options(data: Any) -> Any:
    """`{type: x, x: {...}}` (options nested under the component's name) -> the options beside `type`."""
    if isinstance(data, dict) and isinstance(data.get("type"), str) and isinstance(data.get(data["type"]), dict):
        nested = data[data["type"]]
        data = {**nested, **{key: value for key, value in data.items() if key != data["type"]}}
    return data


# ASTune's names for the built-in readers and their split keys, accepted so its configs load unchanged.
LEGACY_READER_TYPES = {"huggingface_dat_repo": "huggingface", "dataset_file": "file"}
LEGACY_SPLIT_KEYS = {"training_split": "train_split"}


class TaskReaderConfig(ComponentSection):
    type: str = Field(default="file", description="Task reader name: file, huggingface, or one from a plugin.")
    train_split: str = Field(default="train", description="Split used for training.")
    validation_split: str | None = Field(default=None, description="Split used for validation (none: skip).")
    read_timeout: float = Field(
        default=READ_TIMEOUT_S, gt=0, le=7 * 86400,
        description="Seconds the reader may take to produce each next task (the first included, so a first "
                    "download counts) or to check its splits; past it the run stops with an error naming the "
                    "reader instead of hanging. See docs/reliability.md.")

    @model_validator(mode="before")
    @classmethod
    def _accept_legacy_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = flatten_named_options(data)
        data = {LEGACY_SPLIT_KEYS.get(key, key): value for key, value in data.items()}
        if data.get("type") in LEGACY_READER_TYPES:
            data["type"] = LEGACY_READER_TYPES[data["type"]]
        return data


class JudgeConfig(ComponentSection):

    type: str | None = Field(
        default=None,
        description="Judge name (math, llm_judge, env_service, custom, ...). None: the workflow's reward is used.",
    )
    judge_protocol: str | None = Field(
        default=None,
        description="'module:Class' of a Judge subclass (ASTune's key); implies type 'custom'.",
    )
    always_run: bool = Field(default=False, description="Run the judge even when the workflow set a reward.")
    timeout: float = Field(default=60.0, gt=0, le=86400,
                           description="Seconds a judge may take per episode; past it the episode ends judge_timeout "
                                       "(and, isolated in a process, the judge's whole process tree is killed).")
    isolation: Literal["process", "thread", "loop"] = Field(
        default="process",
        description="Where the judge's code runs: process (worker processes: timeout, memory limit and process-tree "
                    "kill enforced), thread (a thread of the trainer with its own event loop: timeout only, the "
                    "thread is abandoned) or loop (the trainer's event loop: for an async judge handed live async "
                    "clients; the timeout holds while it awaits). Built-in judges that only await I/O run on the "
                    "event loop whatever this says. See docs/reliability.md.")
    workers: int = Field(default=4, ge=1, le=256, description="Judge worker processes (judge.isolation: process); "
                                                              "each runs one call at a time.")
    memory_limit_mb: float = Field(
        default=4096, gt=0, le=1024 * 1024,
        description="Most resident memory (MB) a judge worker and all its descendants may use; past it the episode "
                    "ends judge_memory and the worker's process tree is killed (judge.isolation: process).")


class EngineConfig(ComponentSection):
    type: str = Field(default="hf", description="Inference engine: hf (transformers), openai (a served model), vllm, ...")


class ModelConfig(Section):
    path: str = Field(default="", description="Hugging Face model id or local directory of the model to train.")
    tokenizer: str | None = Field(default=None, description="Tokenizer path, when it differs from `path`.")
    max_model_len: int = Field(default=4096, gt=0, le=MAX_MODEL_LEN,
                               description="Longest prompt + response the model accepts.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights dtype; auto = float32 on CPU, bfloat16 on GPU."
    )
    trust_remote_code: bool = Field(default=False, description="Allow custom model code from the model repo.")


class GatewayConfig(Section):
    host: str = Field(default="127.0.0.1", description="Address the gateway binds to. Loopback unless you need remote agents.")
    port: int = Field(default=0, ge=0, le=65535, description="Port; 0 picks a free one.")
    tool_parser: str = Field(default="hermes", description="How tool calls are parsed from model text.")
    reasoning_parser: str | None = Field(default="think", description="Reasoning format (<think>...</think>); null: none.")
    # Defences against careless and hostile clients (SECURITY.md lists them with agenttune serve's and logview's).
    max_body_mib: float = Field(default=8, gt=0, description="Largest request body in MiB; larger ones get 413 before they are read.")
    request_timeout_s: float = Field(default=30, gt=0, description="Seconds a connection has to send a whole request (408 after).")
    keep_alive_timeout_s: float = Field(default=30, gt=0, description="Seconds an idle keep-alive connection stays open.")
    max_connections: int = Field(default=1000, ge=1, description="Most open connections; more get 503 (at most 3/4 of the fd limit).")
    allowed_hosts: list[str] = Field(default_factory=list, description="agenttune serve on loopback: Host/Origin names accepted besides loopback ones.")


class RolloutConfig(Section):
    num_repeat: int = Field(default=4, gt=0, le=MAX_REPEAT,
                            description="Episodes per task per step (the GRPO group size).")
    max_env_worker: int = Field(default=16, gt=0, le=MAX_EPISODES_PER_STEP, description="Most episodes run at once.")
    workflow_processes: int = Field(
        default=1, ge=1, le=256,
        description="Processes that run workflows (1: the trainer's own). More give agents and the gateway's "
                    "per-call work one event loop per core, each with its own gateway; the engine stays in the "
                    "trainer, and the workflow must be importable by name.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature for training rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(default=-1, description="Top-k sampling; -1 disables it.")
    val_temperature: float = Field(default=0.0, ge=0, description="Temperature for validation (0 = greedy).")
    max_turns: int = Field(
        default=8, gt=0, le=100_000, description="Most model calls per agent per episode: the gateway refuses the next one "
                                     "(400 max_turns_exceeded, status turn_limit). Workflows also use it to bound "
                                     "their environment steps.")
    max_response_length_in_one_turn: int = Field(default=512, gt=0, le=MAX_MODEL_LEN,
                                                  description="Most new tokens per LLM call (less than model.max_model_len).")
    episode_timeout: float = Field(default=300.0, gt=0, le=7 * 86400,
                                   description="Seconds before an episode is stopped and marked timeout.")
    agent_madness_reward: float = Field(default=0.0, description="Reward given to an episode when a madness check fires.")
    context_overflow_reward: float | None = Field(
        default=None, description="Reward of an episode that ended because its conversation outgrew "
                                  "model.max_model_len (status context_overflow); none: the judge scores it.")
    turn_limit_reward: float | None = Field(
        default=None, description="Reward of an episode that ended because an agent asked for more than "
                                  "rollout.max_turns model calls (status turn_limit); none: the judge scores it.")
    compute_madness_checklist: list[MadnessCheck] = Field(
        default_factory=lambda: list(MADNESS_CHECKS), description="Madness checks to run."
    )
    trainable_targets: list[str] | None = Field(
        default=None, description="Agent names whose samples are trained; none: every agent."
    )


class DataConfig(Section):
    train_batch_size: int = Field(default=8, gt=0, le=MAX_EPISODES_PER_STEP,
                                  description="Tasks per training step (each run num_repeat times).")
    val_batch_size: int | None = Field(default=None, gt=0, le=MAX_EPISODES_PER_STEP,
                                       description="Tasks per validation batch; none: the whole split.")
    max_prompt_length: int | None = Field(
        default=None, gt=0, le=MAX_MODEL_LEN, description="Longest prompt (tokens) a trained sample may have; none: model.max_model_len - "
                                        "rollout.max_response_length_in_one_turn. Longer merged samples are split at "
                                        "call boundaries, never cut.")
    max_response_length: int | None = Field(
        default=None, gt=0, le=MAX_MODEL_LEN, description="Longest merged response (tokens) a trained sample may have; none: "
                                        "model.max_model_len (nothing the gateway let through is split).")
    shuffle: bool = Field(default=True, description="Shuffle the train split every epoch (seeded).")

    def length_limits(self) -> tuple[int, int]:
        """(max_prompt_length, max_response_length) of a validated config, where neither is None:
        AgentTuneConfig fills the unset ones in from model.max_model_len."""
        if self.max_prompt_length is None or self.max_response_length is None:
            raise RuntimeError("data.max_prompt_length / max_response_length are unset: they are filled in "
                               "when the whole AgentTuneConfig is validated")
        return self.max_prompt_length, self.max_response_length


class AlgorithmConfig(Section):
    adv_estimator: str = Field(default="grpo", description="Advantage estimator, a registered name (`agenttune plugins "
                               "list`): grpo, dr_grpo, rloo, reinforce_plus_plus_baseline, turn_grpo, "
                               "rejection_sampling, or a plugin's.")
    estimator_options: dict[str, Any] = Field(default_factory=dict, description="The estimator's options (its `Options` "
                                              "model validates them), e.g. {gamma: 0.9} for turn_grpo.")
    norm_adv_by_std: bool = Field(default=True, description="grpo: divide group-centred rewards by the group's std "
                                  "(false is dr_grpo; verl's norm_adv_by_std_in_grpo).")
    policy_loss: str = Field(default="ppo_clip", description="Policy loss, a registered name: ppo_clip, gspo, cispo, "
                             "cross_entropy, distillation, or a plugin's.")
    policy_loss_options: dict[str, Any] = Field(default_factory=dict, description="The policy loss's options.")
    zero_variance_groups: Literal["keep", "drop"] = Field(
        default="keep", description="Groups without a learning signal (every episode the same reward): keep trains them "
        "with the estimator's advantage (0 for grpo, rloo) so their tokens stay in the token-mean denominator, as verl "
        "does; drop leaves them out, so the loss is averaged over the informative groups' tokens only (a larger step "
        "when most groups are uninformative).")
    dynamic_sampling: DynamicSamplingOptions = Field(
        default_factory=DynamicSamplingOptions, description="Replace uninformative groups by fresh ones (DAPO).")
    overlong_shaping: OverlongShapingOptions = Field(
        default_factory=OverlongShapingOptions, description="DAPO's soft penalty on overlong responses.")
    clip_ratio_low: float = Field(default=0.2, ge=0, description="PPO clip range below 1.")
    clip_ratio_high: float = Field(default=0.2, ge=0, description="PPO clip range above 1.")
    kl_coef: float = Field(default=0.0, ge=0, description="KL penalty to the reference model; 0 disables it (no reference model).")
    kl_estimator: Literal["k1", "k3"] = Field(default="k3", description="KL estimator.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean"] = Field(
        default="token-mean", description="How per-token losses are averaged."
    )
    rollout_correction: RolloutCorrectionOptions = Field(
        default_factory=RolloutCorrectionOptions,
        description="Importance weights and rejection for tokens the engine sampled off-policy (verl 0.9.1's "
                    "names). Off by default in trainer.mode sync; asynchronous modes default to token-level truncated "
                    "importance sampling (rollout_is: token, threshold 2.0) unless this section is set. See docs/local.md.")


class TrainerConfig(Section):
    total_epochs: int = Field(default=1, gt=0, le=1_000_000, description="Passes over the train split.")
    total_steps: int | None = Field(default=None, gt=0, le=1_000_000_000,
                                    description="Stop after this many steps (overrides epochs).")
    learning_rate: float = Field(default=1e-6, gt=0, description="Peak learning rate.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(default="constant", description="Learning-rate schedule.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(default=1.0, gt=0, description="Gradient norm clipping.")
    save_freq: int = Field(default=0, ge=0, description="Save a checkpoint every N steps; 0: only at the end.")
    test_freq: int = Field(default=0, ge=0, description="Validate every N steps; 0: never during training.")
    val_before_train: bool = Field(default=False, description="Validate once before the first step.")
    seed: int = Field(default=42, description="Seed for data order, sampling and initialisation.")
    n_gpus_per_node: int = Field(default=1, ge=0, description="GPUs per node (cluster backbones).")
    nnodes: int = Field(default=1, gt=0, description="Nodes (cluster backbones).")
    mode: Literal["sync", "one_step_off", "async"] = Field(
        default="sync", description="sync: roll out a batch, then train on it. async: groups for later steps roll out "
        "while a step trains, from the engine's own copy of the weights (refreshed after every update, also "
        "mid-episode), within `max_staleness`. one_step_off: async with max_staleness 1 (verl's one-step off-policy). "
        "Asynchronous modes need engine.type hf or vllm (local backbone).")
    max_staleness: int = Field(
        default=1, ge=0, description="async: the most policy versions a trained token may lag behind the weights being "
        "trained; groups with older tokens are dropped and counted (async/dropped_groups).")

    @property
    def staleness_bound(self) -> int | None:
        """How many versions rollouts may run ahead of training; None: synchronous."""
        return {"sync": None, "one_step_off": 1}.get(self.mode, self.max_staleness)


class MonitorConfig(Section):
    tensorboard: bool = Field(default=True, description="Write TensorBoard event files to <run_dir>/tensorboard.")
    wandb: bool = Field(default=False, description="Log to Weights & Biases (needs wandb installed).")
    swanlab: bool = Field(default=False, description="Log to SwanLab (needs swanlab installed).")


# The YAML file's values while `config_loader.build_config` validates them: a settings source
# between the environment and the defaults (see AgentTuneConfig.settings_customise_sources).
yaml_values: ContextVar[Mapping[str, Any] | None] = ContextVar("agenttune_yaml_values", default=None)


class YamlValues(PydanticBaseSettingsSource):
    """The settings source of the YAML file's values (read and checked by config_loader.read_yaml)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return (yaml_values.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(yaml_values.get() or {})


# What asynchronous modes use when `algorithm.rollout_correction` is left unset: verl's token-level TIS.
ASYNC_DEFAULT_CORRECTION: dict[str, Any] = {"rollout_is": "token", "rollout_is_threshold": 2.0}


class AgentTuneConfig(BaseSettings):
    """The whole configuration of one run."""

    model_config = SettingsConfigDict(
        env_prefix="AGENTTUNE_", env_nested_delimiter="__", extra="forbid", validate_assignment=True
    )

    project_name: str = Field(default="agenttune", description="Project name; groups runs under runs/<project>.")
    experiment_name: str = Field(default="default", description="Experiment name; runs/<project>/<experiment>.")
    workflow: str | None = Field(default=None, description="'module:Class' of your Workflow subclass.")
    agent_framework: str = Field(default="openai", description="Agent framework: openai, agentscope, aworld, ...")
    backbone: str = Field(default="local", description="Backbone: debug, local, verl, trinity (--backbone overrides).")
    task_reader: TaskReaderConfig = Field(
        default_factory=TaskReaderConfig,
        description="Where tasks come from: the reader's `type`, the split names, and the reader's own options.",
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="How episodes are scored: the judge's `type` and its own options."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The model under training.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig, description="The inference engine behind the gateway: `type` and its options."
    )
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="The OpenAI-compatible endpoint agents talk to."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Running episodes.")
    data: DataConfig = Field(default_factory=DataConfig, description="Batches and length limits.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="The RL objective (GRPO).")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="The training schedule.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Where metrics are logged.")
    policies: PoliciesConfig = Field(
        default_factory=PoliciesConfig,
        description="Several policies in one run: LoRA adapters on the base model and which agent uses which "
                    "(docs/multi_policy.md). Empty: one policy.")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Highest first: keyword arguments (overrides, flags), `AGENTTUNE_…` variables, the YAML file."""
        return init_settings, env_settings, YamlValues(settings_cls)

    # The sections `with_sections` added to this class: (name, model) pairs.
    owned_sections: ClassVar[tuple[tuple[str, type[BaseModel]], ...]] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its sections and state: a loaded config's class is made at run time (with_sections),
        so pickle cannot find it by name; the worker process that unpickles it makes the same class."""
        return _unpickled, (type(self).owned_sections, self.__getstate__())

    # The directory of the YAML file: workflow and judge modules next to it are importable.
    _source_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _length_limits_from_the_model(self) -> AgentTuneConfig:
        """Unset training length limits follow the model's: a merged sample is never cut by default.
        Set ones must fit the model (a UserError naming both keys, raised as one paragraph)."""
        check_lengths(self)
        if self.data.max_prompt_length is None:
            room = self.model.max_model_len - self.rollout.max_response_length_in_one_turn
            self.data.max_prompt_length = max(room, 1)
        if self.data.max_response_length is None:
            self.data.max_response_length = self.model.max_model_len
        return self

    @model_validator(mode="after")
    def _policies_are_mapped(self) -> AgentTuneConfig:
        """Every mapped agent names a defined policy and every policy is used (one paragraph otherwise)."""
        check_policies(self.policies)
        return self

    @model_validator(mode="after")
    def _asynchronous_training_is_corrected(self) -> AgentTuneConfig:
        """Asynchronous modes weigh stale tokens by token-level truncated importance sampling unless the
        user configured `algorithm.rollout_correction` themselves: without it the quickstart trained at
        max_staleness 2 once fell from 100 % to 56 % held-out (docs/local.md). An explicit choice, off
        included (`rollout_is: null`), is kept as written."""
        algorithm = self.algorithm
        chosen = "rollout_correction" in algorithm.model_fields_set and algorithm.rollout_correction.model_fields_set
        if self.trainer.staleness_bound and not chosen:  # 0: the synchronous schedule, nothing stale
            algorithm.rollout_correction = RolloutCorrectionOptions(
                rollout_is=ASYNC_DEFAULT_CORRECTION["rollout_is"],
                rollout_is_threshold=ASYNC_DEFAULT_CORRECTION["rollout_is_threshold"])
        return self

    @property
    def source_dir(self) -> Path | None:
        return self._source_dir

    @overload
    def section(self, name: str) -> Any: ...
    @overload
    def section(self, name: str, model: type[SectionModel]) -> SectionModel: ...

    def section(self, name: str, model: type[BaseModel] | None = None) -> Any:
        """The section a component or plugin owns: a backbone's `Options`, a `register_config_sections` model.

        A config from `load_config` / `config_model()` holds the sections of every installed owner.
        One made directly as `AgentTuneConfig(...)` holds none: then `model`'s defaults are returned.
        """
        if name in type(self).model_fields:
            value = getattr(self, name)
            if model is not None and not isinstance(value, model):
                raise TypeError(f"config section {name!r} holds a {type(value).__name__}, not the {model.__name__} "
                                "asked for: two components claim the section with different models")
            return value
        if model is not None:
            return model()
        raise UserError(f"The configuration has no section {name!r}.",
                        hint="A plugin owns that section: install it (`agenttune plugins list` shows the sections "
                             "of the installed plugins), and build the config with agenttune.load_config or "
                             "config_model(), which add the plugins' sections.")


SectionList = tuple[tuple[str, type[BaseModel]], ...]


@cache
def with_sections(sections: SectionList) -> type[AgentTuneConfig]:
    """AgentTuneConfig plus the top-level sections components and plugins own (one class per set)."""
    if not sections:
        return AgentTuneConfig
    fields = {name: (model, Field(default_factory=model, description=_first_line(model.__doc__)))
              for name, model in sections}
    model: type[AgentTuneConfig] = create_model(  # type: ignore[call-overload]
        "AgentTuneConfig", __base__=AgentTuneConfig, **fields)
    model.owned_sections = sections
    return model


def _unpickled(sections: SectionList, state: dict[str, Any]) -> AgentTuneConfig:
    model = with_sections(sections)
    config = model.__new__(model)
    config.__setstate__(state)  # the state of a validated config: not validated again
    return config


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def check_lengths(config: AgentTuneConfig) -> None:
    """Counts and lengths that are each valid but impossible together; a UserError naming both keys."""
    max_model_len, turn = config.model.max_model_len, config.rollout.max_response_length_in_one_turn
    data = config.data
    if turn >= max_model_len:
        raise UserError(f"rollout.max_response_length_in_one_turn ({turn}) must be less than model.max_model_len "
                        f"({max_model_len}): every model call reserves that many new tokens, and the prompt needs room "
                        "too, so the gateway would refuse every call that does not set max_tokens.",
                        hint="Lower rollout.max_response_length_in_one_turn (a quarter of max_model_len is common) or "
                             "raise model.max_model_len to what the model supports.")
    for key, value in (("max_prompt_length", data.max_prompt_length), ("max_response_length", data.max_response_length)):
        if value is not None and value > max_model_len:
            raise UserError(f"data.{key} ({value}) is longer than model.max_model_len ({max_model_len}): no sample "
                            "the gateway lets through can be that long.",
                            hint=f"Lower data.{key}, or remove it to follow model.max_model_len.")
    # Unset, they become (max_model_len - one turn, max_model_len), deliberately overlapping: that pair (also
    # when a dumped config is read back) is no mistake.
    followed = (data.max_prompt_length, data.max_response_length) == (max(max_model_len - turn, 1), max_model_len)
    both_set = data.model_fields_set >= {"max_prompt_length", "max_response_length"}
    if both_set and not followed and data.max_prompt_length is not None and data.max_response_length is not None:
        total = data.max_prompt_length + data.max_response_length
        if total > max_model_len:
            raise UserError(f"data.max_prompt_length + data.max_response_length ({data.max_prompt_length} + "
                            f"{data.max_response_length} = {total}) is more than model.max_model_len ({max_model_len}): "
                            "a trained sample (prompt and response) must fit in the model's context.",
                            hint="Lower one of them so that their sum is at most model.max_model_len, or remove both to "
                                 "follow model.max_model_len.")
    episodes = config.data.train_batch_size * config.rollout.num_repeat
    if episodes > MAX_EPISODES_PER_STEP:
        raise UserError(f"data.train_batch_size x rollout.num_repeat ({config.data.train_batch_size} x "
                        f"{config.rollout.num_repeat} = {episodes}) episodes per step is more than {MAX_EPISODES_PER_STEP}: "
                        "every episode of a step is scheduled at once.",
                        hint="Lower data.train_batch_size or rollout.num_repeat.")


# The backbones that train with `algorithm.adv_estimator` (the others, debug included, only roll out or
# bring their own objective).
GRPO_BACKBONES = frozenset({"local", "verl", "trinity"})


def check_training_signal(config: AgentTuneConfig) -> None:
    """Configurations that would run every step and train nothing: refused before the first one.

    Not part of validation: rollouts without training (the debug backbone, the rollout engine on its
    own) may use them. Groups too small for the advantage estimator (num_repeat 1 with grpo) are the
    estimator's to judge: `components.resolve` asks its `check_group_size` for the training backbones.
    """
    validates = config.trainer.test_freq > 0 or config.trainer.val_before_train
    if validates and not config.task_reader.validation_split:
        keys = "trainer.test_freq" if config.trainer.test_freq > 0 else "trainer.val_before_train"
        raise UserError(f"{keys} asks for validation, but task_reader.validation_split is not set, so there is "
                        "nothing to validate on.",
                        hint="Set task_reader.validation_split to a split of your data (e.g. test), or set "
                             "trainer.test_freq: 0 and trainer.val_before_train: false.")
    if config.rollout.trainable_targets == []:
        raise UserError("rollout.trainable_targets is an empty list: no agent's samples would be trained.",
                        hint="List the agent names to train, or remove the key (null) to train every agent.")
