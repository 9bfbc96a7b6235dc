"""What a plugin may import from agenttune: the plugin API, version `PLUGIN_API_VERSION`.

A plugin's code imports agenttune through this module only (`from agenttune.plugin_api import
Judge, UserError, hookimpl`), and its tests through this module, the package root (the user API:
`Task`, `Workflow`, ...) and `agenttune.testing`. The compatibility rules (docs/plugins.md): what is
named here keeps its name and meaning within a release line (0.2.x), wherever it moves inside
agenttune; a new line may add names, and a name it moves or retires keeps working for that one line
with a DeprecationWarning naming the new import (agenttune/compatibility.py), then goes. Plugins pin the line
they were written for (`agenttune>=0.2,<0.3`) and may check `PLUGIN_API_VERSION` at run time.
tests/test_plugin_api.py checks every plugin under plugins/ for it (their source files, parsed).

Names are imported on first use, from the module they live in (`_WHERE`), so importing one name
costs what importing its module costs and `agenttune --help` stays light. To add a name: add it to
`_WHERE` and to the `TYPE_CHECKING` block (type checkers read that one; a test keeps the two equal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttune.backbones.base import Backbone, missing_validation_split
    from agenttune.backbones.local.rollout_correction import importance_weights, rejection_mask
    from agenttune.cli.main import app as cli_app
    from agenttune.cli.main import main as cli_main
    from agenttune.compatibility import PLUGIN_API_VERSION
    from agenttune.components import Components, resolve
    from agenttune.config import AgentTuneConfig, JudgeConfig, TaskReaderConfig
    from agenttune.config_loader import (
        apply_overrides,
        build_config,
        component_options,
        config_model,
        load_config,
    )
    from agenttune.engines.base import FinishReason, Generation, InferenceEngine, SamplingParams
    from agenttune.engines.hf import HFEngine
    from agenttune.engines.openai import OpenAIEngine, OpenAIEngineOptions
    from agenttune.engines.scripted import ScriptedEngine, scripted_logprob
    from agenttune.episode import Episode, EpisodeStatus, Sample, fit_all, record_fitting
    from agenttune.errors import UserError
    from agenttune.estimators.base import AdvantageEstimator, Advantages, Scored
    from agenttune.frameworks.base import AgentFramework
    from agenttune.gateway import Gateway
    from agenttune.gateway.completions import logprob_problem
    from agenttune.hookspecs import hookimpl
    from agenttune.http_retry import RetryPolicy, send_with_retries
    from agenttune.in_process import keep, reference_for
    from agenttune.judges.base import Judge, JudgeInput, JudgeResult
    from agenttune.judges.llm_judge import LLMJudge, LLMJudgeError, LLMJudgeOptions
    from agenttune.losses.base import LossInput, LossOutput, PolicyLoss
    from agenttune.model_loading import resolve_model_path
    from agenttune.objective_options import OverlongShapingOptions
    from agenttune.parsers.base import ReasoningParser, ToolParse, ToolParser
    from agenttune.plugins import get_component, get_plugin_manager, registered_plugin
    from agenttune.readers.base import TaskReader
    from agenttune.references import load_reference
    from agenttune.rollout.engine import RolloutEngine
    from agenttune.rollout.frameworks import FrameworkLoader
    from agenttune.rollout.log import RolloutLog, TokenText, read_records, to_record
    from agenttune.rollout.metrics import MetricsLog, step_metrics
    from agenttune.rollout.session import RolloutSession, rollout_session
    from agenttune.run import Run, configure_logging, get_logger, prepare_run
    from agenttune.serve import serve
    from agenttune.task import Task, WorkflowTask
    from agenttune.trainer import Trainer, with_changes
    from agenttune.training import train_from_config
    from agenttune.tuner import ModelTuner
    from agenttune.workflow import Workflow, WorkflowOutput

# name -> (module, attribute). Grouped by what a plugin does with them.
_WHERE: dict[str, tuple[str, str]] = {
    # The release line of this API, for plugins to check (docs/plugins.md: the compatibility rules).
    "PLUGIN_API_VERSION": ("agenttune.compatibility", "PLUGIN_API_VERSION"),
    # Registering components: the hook marker and the contracts the hooks return subclasses of.
    "hookimpl": ("agenttune.hookspecs", "hookimpl"),
    "TaskReader": ("agenttune.readers.base", "TaskReader"),
    "AgentFramework": ("agenttune.frameworks.base", "AgentFramework"),
    "Judge": ("agenttune.judges.base", "Judge"),
    "Backbone": ("agenttune.backbones.base", "Backbone"),
    "InferenceEngine": ("agenttune.engines.base", "InferenceEngine"),
    "ToolParser": ("agenttune.parsers.base", "ToolParser"),
    "ReasoningParser": ("agenttune.parsers.base", "ReasoningParser"),
    "UserError": ("agenttune.errors", "UserError"),
    "AdvantageEstimator": ("agenttune.estimators.base", "AdvantageEstimator"),
    "PolicyLoss": ("agenttune.losses.base", "PolicyLoss"),
    # What flows through them.
    "Task": ("agenttune.task", "Task"),
    "WorkflowTask": ("agenttune.task", "WorkflowTask"),
    "Workflow": ("agenttune.workflow", "Workflow"),
    "WorkflowOutput": ("agenttune.workflow", "WorkflowOutput"),
    "ModelTuner": ("agenttune.tuner", "ModelTuner"),
    "FrameworkLoader": ("agenttune.rollout.frameworks", "FrameworkLoader"),
    "JudgeInput": ("agenttune.judges.base", "JudgeInput"),
    "JudgeResult": ("agenttune.judges.base", "JudgeResult"),
    "Episode": ("agenttune.episode", "Episode"),
    "EpisodeStatus": ("agenttune.episode", "EpisodeStatus"),
    "Sample": ("agenttune.episode", "Sample"),
    "fit_all": ("agenttune.episode", "fit_all"),
    "record_fitting": ("agenttune.episode", "record_fitting"),
    "Generation": ("agenttune.engines.base", "Generation"),
    "SamplingParams": ("agenttune.engines.base", "SamplingParams"),
    "FinishReason": ("agenttune.engines.base", "FinishReason"),
    "ToolParse": ("agenttune.parsers.base", "ToolParse"),
    "Scored": ("agenttune.estimators.base", "Scored"),
    "Advantages": ("agenttune.estimators.base", "Advantages"),
    "LossInput": ("agenttune.losses.base", "LossInput"),
    "LossOutput": ("agenttune.losses.base", "LossOutput"),
    # Configuration.
    "AgentTuneConfig": ("agenttune.config", "AgentTuneConfig"),
    "JudgeConfig": ("agenttune.config", "JudgeConfig"),
    "TaskReaderConfig": ("agenttune.config", "TaskReaderConfig"),
    "load_config": ("agenttune.config_loader", "load_config"),
    "build_config": ("agenttune.config_loader", "build_config"),
    "apply_overrides": ("agenttune.config_loader", "apply_overrides"),
    "component_options": ("agenttune.config_loader", "component_options"),
    "config_model": ("agenttune.config_loader", "config_model"),
    "load_reference": ("agenttune.references", "load_reference"),
    "reference_for": ("agenttune.in_process", "reference_for"),
    "keep": ("agenttune.in_process", "keep"),
    # Finding components.
    "get_component": ("agenttune.plugins", "get_component"),
    "get_plugin_manager": ("agenttune.plugins", "get_plugin_manager"),
    "registered_plugin": ("agenttune.plugins", "registered_plugin"),
    "Components": ("agenttune.components", "Components"),
    "resolve": ("agenttune.components", "resolve"),
    # Backbones: a run, its rollouts and what they leave on disk.
    "Run": ("agenttune.run", "Run"),
    "prepare_run": ("agenttune.run", "prepare_run"),
    "configure_logging": ("agenttune.run", "configure_logging"),
    "get_logger": ("agenttune.run", "get_logger"),
    "missing_validation_split": ("agenttune.backbones.base", "missing_validation_split"),
    "RolloutSession": ("agenttune.rollout.session", "RolloutSession"),
    "rollout_session": ("agenttune.rollout.session", "rollout_session"),
    "RolloutEngine": ("agenttune.rollout.engine", "RolloutEngine"),
    "Gateway": ("agenttune.gateway", "Gateway"),
    "logprob_problem": ("agenttune.gateway.completions", "logprob_problem"),
    "RolloutLog": ("agenttune.rollout.log", "RolloutLog"),
    "TokenText": ("agenttune.rollout.log", "TokenText"),
    "read_records": ("agenttune.rollout.log", "read_records"),
    "to_record": ("agenttune.rollout.log", "to_record"),
    "MetricsLog": ("agenttune.rollout.metrics", "MetricsLog"),
    "step_metrics": ("agenttune.rollout.metrics", "step_metrics"),
    "resolve_model_path": ("agenttune.model_loading", "resolve_model_path"),
    "Trainer": ("agenttune.trainer", "Trainer"),
    "with_changes": ("agenttune.trainer", "with_changes"),
    "train_from_config": ("agenttune.training", "train_from_config"),
    "serve": ("agenttune.serve", "serve"),
    "cli_app": ("agenttune.cli.main", "app"),
    "cli_main": ("agenttune.cli.main", "main"),
    # Built-in components a plugin builds on.
    "OpenAIEngine": ("agenttune.engines.openai", "OpenAIEngine"),
    "OpenAIEngineOptions": ("agenttune.engines.openai", "OpenAIEngineOptions"),
    "HFEngine": ("agenttune.engines.hf", "HFEngine"),
    "ScriptedEngine": ("agenttune.engines.scripted", "ScriptedEngine"),
    "scripted_logprob": ("agenttune.engines.scripted", "scripted_logprob"),
    "LLMJudge": ("agenttune.judges.llm_judge", "LLMJudge"),
    "LLMJudgeOptions": ("agenttune.judges.llm_judge", "LLMJudgeOptions"),
    "LLMJudgeError": ("agenttune.judges.llm_judge", "LLMJudgeError"),
    # Rollout correction: the local backbone's maths, which a backbone's own must match.
    "importance_weights": ("agenttune.backbones.local.rollout_correction", "importance_weights"),
    "rejection_mask": ("agenttune.backbones.local.rollout_correction", "rejection_mask"),
    # DAPO's overlong reward shaping (algorithm.overlong_shaping), which a backbone applies to its rewards.
    "OverlongShapingOptions": ("agenttune.objective_options", "OverlongShapingOptions"),
    # Talking to services.
    "RetryPolicy": ("agenttune.http_retry", "RetryPolicy"),
    "send_with_retries": ("agenttune.http_retry", "send_with_retries"),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"agenttune.plugin_api has no {name!r}: it is not part of the plugin API "
                             "(see docs/plugins.md, 'What a plugin may import').")
    module, attribute = _WHERE[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return __all__
