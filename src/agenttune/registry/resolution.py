"""Resolve the components a config names, before any heavy work starts.

`resolve(config)` checks that the backbone, agent framework, task reader, workflow and judge all exist
and load, validates each component's options, and returns them together. `preflight(config)` adds
what else a run needs before it loads weights: the engine's options, the model directory's config and
its tokenizer. `agenttune train` and `agenttune config check` both run `preflight`, so they refuse a
config with the same message. Every failure is a `UserError` naming the config key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agenttune.components.engines.base import InferenceEngine
from agenttune.components.engines.model_loading import check_tokenizer, context_window, read_model_config
from agenttune.components.readers.deadline import check_splits, read_tasks
from agenttune.config.models import GRPO_BACKBONES, READ_TIMEOUT_S, AgentTuneConfig, check_training_signal
from agenttune.config.references import load_reference
from agenttune.config.run import Run, get_logger
from agenttune.errors import UserError
from agenttune.registry.config_loading import component_options
from agenttune.registry.manager import get_component
from agenttune.workflow.base import Workflow
from agenttune.workflow.task import Task


@dataclass
class Components:
    backbone: type
    agent_framework: type
    task_reader_cls: type
    task_reader_options: Any
    workflow_cls: type[Workflow] | None
    judge_cls: type | None
    judge_options: Any
    estimator: Any = None  # the AdvantageEstimator algorithm.adv_estimator names
    policy_loss: Any = None  # the PolicyLoss algorithm.policy_loss names
    read_timeout: float = READ_TIMEOUT_S  # task_reader.read_timeout

    def task_reader(self) -> Any:
        return self.task_reader_cls(self.task_reader_options)

    def read_tasks(self, split: str, *, limit: int | None = None) -> Iterator[Task]:
        """The tasks of `split` (the first `limit`), each within task_reader.read_timeout of the one before:
        a reader that hangs raises UserError instead of stalling the run (components/readers/deadline.py)."""
        return read_tasks(self.task_reader(), split, timeout=self.read_timeout, limit=limit)

    def judge(self) -> Any | None:
        return self.judge_cls(self.judge_options) if self.judge_cls else None


def judge_type(config: AgentTuneConfig) -> str | None:
    if config.judge.judge_protocol and config.judge.type in (None, "custom"):
        return "custom"
    return config.judge.type


def resolve_workflow(config: AgentTuneConfig) -> type[Workflow] | None:
    if not config.workflow:
        return None
    workflow = load_reference(config.workflow, key="workflow", search_path=config.source_dir)
    is_workflow_class = isinstance(workflow, type) and callable(getattr(workflow, "execute", None))
    if not is_workflow_class:
        raise UserError(f"workflow: {config.workflow!r} is not a Workflow class (got {type(workflow).__name__}).",
                        hint="Point it at a subclass of agenttune.Workflow that implements execute(task, tuner).")
    return workflow


def resolve_judge_class(config: AgentTuneConfig) -> type | None:
    """The judge class: a registered judge by `judge.type`, or the user's class for `custom`."""
    name = judge_type(config)
    if name is None:
        return None
    if name != "custom":
        return get_component("judges", name, key="judge.type")
    if not config.judge.judge_protocol:
        raise UserError("judge.type is 'custom' but judge.judge_protocol is not set.",
                        hint="Set judge.judge_protocol to 'my_module:MyJudge' (a subclass of agenttune.Judge).")
    judge = load_reference(config.judge.judge_protocol, key="judge.judge_protocol", search_path=config.source_dir)
    if not (isinstance(judge, type) and callable(getattr(judge, "judge", None))):
        raise UserError(f"judge.judge_protocol: {config.judge.judge_protocol!r} is not a Judge class.",
                        hint="Point it at a subclass of agenttune.Judge that implements judge(judge_input).")
    return judge


def resolve_task_reader(config: AgentTuneConfig) -> Any:
    """The configured task reader, with its options validated."""
    reader_cls = get_component("task_readers", config.task_reader.type, key="task_reader.type")
    return reader_cls(component_options(reader_cls, config.task_reader, "task_reader"))


def resolve_objective(config: AgentTuneConfig) -> tuple[Any, Any]:
    """The advantage estimator and policy loss the `algorithm` section names, their options validated.
    (A training backbone also calls the estimator's `check_group_size`; the debug backbone trains nothing.)"""
    algorithm = config.algorithm
    estimator_cls = get_component("advantage_estimators", algorithm.adv_estimator, key="algorithm.adv_estimator")
    options = dict(algorithm.estimator_options)
    if not algorithm.norm_adv_by_std and "norm_by_std" in getattr(estimator_cls.Options, "model_fields", {}):
        options.setdefault("norm_by_std", False)  # the older switch, verl's norm_adv_by_std_in_grpo
    estimator = estimator_cls(_options(estimator_cls, options, "algorithm.estimator_options"))
    loss_cls = get_component("policy_losses", algorithm.policy_loss, key="algorithm.policy_loss")
    loss = loss_cls(_options(loss_cls, dict(algorithm.policy_loss_options), "algorithm.policy_loss_options"))
    return estimator, loss


def _options(component: type, values: dict[str, Any], key: str) -> Any:
    from pydantic import ValidationError

    try:
        return component.Options.model_validate(values)  # type: ignore[attr-defined]
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, item['loc'])) or key}: {item['msg']}" for item in error.errors()[:5])
        raise UserError(f"Invalid {key} for {component.name!r}: {problems}.",  # type: ignore[attr-defined]
                        hint=f"See the {component.name!r} options in docs/local.md (Objectives).") from None  # type: ignore[attr-defined]


def configured_splits(config: AgentTuneConfig) -> list[str]:
    return [split for split in (config.task_reader.train_split, config.task_reader.validation_split) if split]


def resolve(config: AgentTuneConfig, *, need_workflow: bool = True) -> Components:
    backbone = get_component("backbones", config.backbone, key="backbone")
    framework = get_component("agent_frameworks", config.agent_framework, key="agent_framework")
    reader = resolve_task_reader(config)
    check_splits(reader, configured_splits(config), timeout=config.task_reader.read_timeout)
    reader_cls, reader_options = type(reader), reader.options
    workflow = resolve_workflow(config)
    if workflow is None and need_workflow:
        raise UserError("workflow is not set.",
                        hint="Add `workflow: my_package.my_module:MyWorkflow` to the config.")
    judge_cls = resolve_judge_class(config)
    judge_options = component_options(judge_cls, config.judge, "judge") if judge_cls else None
    estimator, policy_loss = resolve_objective(config)
    if config.backbone in GRPO_BACKBONES:  # the debug backbone trains nothing: any group size rolls out
        estimator.check_group_size(config.rollout.num_repeat)
    backbone.check(config)
    return Components(backbone, framework, reader_cls, reader_options, workflow, judge_cls, judge_options,
                      estimator, policy_loss, read_timeout=config.task_reader.read_timeout)


def components_for(run: Run) -> Components:
    """The components `preflight` resolved for this run (`train_from_config` hands them over on the
    `Run`); resolved here, once, for a run started another way (a test, a plugin's own launcher)."""
    if run.components is None:
        run.components = resolve(run.config)
    return run.components


def engine_class(config: AgentTuneConfig) -> type[InferenceEngine]:
    """The class `config.engine.type` names (its ClassVars say what it can do, before it is built)."""
    return get_component("engines", config.engine.type, key="engine.type")


def build_engine(config: AgentTuneConfig, tokenizer: Any, model: Any = None) -> InferenceEngine:
    """The inference engine of `config.engine`; `model` is an already-loaded model to share (hf)."""
    engine_cls = engine_class(config)
    options = component_options(engine_cls, config.engine, "engine")
    return engine_cls.from_config(config, options, tokenizer, model=model)


def preflight(config: AgentTuneConfig) -> Components:
    """Every reference a run needs, resolved without loading the model's weights (see the module doc),
    and a config that would train nothing refused."""
    check_training_signal(config)
    components = resolve(config)
    for split in configured_splits(config) if getattr(components.task_reader_cls, "reads_locally", False) else ():
        for _ in components.read_tasks(split):  # every row: a broken line or a missing column fails here, not mid-run
            pass
    component_options(engine_class(config), config.engine, "engine")
    if config.model.path:  # a backbone that needs a model says so itself when it is unset (backbone.check)
        check_model(config)
    return components


def check_model(config: AgentTuneConfig) -> None:
    """The model's config (architecture, context length) and its tokenizer, without its weights; a local
    model directory is read as files, so this imports neither torch nor transformers (model_loading)."""
    window = context_window(read_model_config(config.model))
    check_tokenizer(config.model)
    if window is not None and config.model.max_model_len > window:
        get_logger("config").warning(
            "model.max_model_len is longer than the model's context window", max_model_len=config.model.max_model_len,
            max_position_embeddings=window, hint="lower model.max_model_len unless the model extrapolates (RoPE scaling)")
