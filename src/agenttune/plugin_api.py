"""What a plugin may import from agenttune: the plugin API, version `PLUGIN_API_VERSION`.

A plugin's code imports agenttune through this module only (`from agenttune.plugin_api import
Judge, UserError, hookimpl`), and its tests through this module, the package root (the user API:
`Task`, `Workflow`, ...) and `agenttune.testing`. The compatibility rules (docs/plugins.md): what is
named here keeps its name and meaning within a release line (0.2.x), wherever it moves inside
agenttune; a new line may add names, and a name it moves or retires keeps working for that one line
with a DeprecationWarning naming the new import (agenttune/registry/compatibility.py), then goes. Plugins pin the line
they were written for (`agenttune>=0.2,<0.3`) and may check `PLUGIN_API_VERSION` at run time.
tests/test_plugin_api.py checks every plugin under plugins/ for it (their source files, parsed).

Names are imported on first use, from the module they live in (`_WHERE`), so importing one name
costs what importing its module costs and `agenttune --help` stays light. To add a name: add it to
`PLUGIN_API` in agenttune/registry/compatibility.py and to the `TYPE_CHECKING` block (type checkers read that one; a test keeps the two equal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> (module, attribute): the table lives with the compatibility rules, below every module it names.
from agenttune.registry.compatibility import PLUGIN_API as _WHERE

if TYPE_CHECKING:
    from agenttune.backbones.local.rollout_correction import importance_weights, rejection_mask
    from agenttune.components.backbone import Backbone, missing_validation_split
    from agenttune.components.engines.base import FinishReason, Generation, InferenceEngine, SamplingParams
    from agenttune.components.engines.hf import HFEngine
    from agenttune.components.engines.model_loading import resolve_model_path
    from agenttune.components.engines.openai import OpenAIEngine, OpenAIEngineOptions
    from agenttune.components.engines.scripted import ScriptedEngine, scripted_logprob
    from agenttune.components.estimators.base import AdvantageEstimator, Advantages, Scored
    from agenttune.components.frameworks.base import AgentFramework
    from agenttune.components.judges.base import Judge, JudgeInput, JudgeResult
    from agenttune.components.judges.llm_judge import LLMJudge, LLMJudgeError, LLMJudgeOptions
    from agenttune.components.losses.base import LossInput, LossOutput, PolicyLoss
    from agenttune.components.parsers.base import ReasoningParser, ToolParse, ToolParser
    from agenttune.components.readers.base import TaskReader
    from agenttune.config.in_process import keep, reference_for
    from agenttune.config.models import AgentTuneConfig, JudgeConfig, TaskReaderConfig
    from agenttune.config.objective_options import OverlongShapingOptions
    from agenttune.config.references import load_reference
    from agenttune.config.run import Run, configure_logging, get_logger, prepare_run
    from agenttune.entrypoints.cli.main import app as cli_app
    from agenttune.entrypoints.cli.main import main as cli_main
    from agenttune.entrypoints.python_api import Trainer, with_changes
    from agenttune.entrypoints.serve import serve
    from agenttune.entrypoints.services import ServiceProcess, exported_variable
    from agenttune.entrypoints.train import train_from_config
    from agenttune.errors import UserError
    from agenttune.gateway import Gateway
    from agenttune.gateway.completions import logprob_problem
    from agenttune.registry.compatibility import PLUGIN_API_VERSION
    from agenttune.registry.config_loading import (
        apply_overrides,
        build_config,
        component_options,
        config_model,
        load_config,
    )
    from agenttune.registry.hookspecs import hookimpl
    from agenttune.registry.manager import get_component, get_plugin_manager, registered_plugin
    from agenttune.registry.resolution import Components, resolve
    from agenttune.rollout.framework_loader import FrameworkLoader
    from agenttune.rollout.log import RolloutLog, TokenText, read_records, to_record
    from agenttune.rollout.metrics import MetricsLog, step_metrics
    from agenttune.rollout.process_tree import keep_after_run
    from agenttune.rollout.rollout_engine import RolloutEngine
    from agenttune.rollout.session import RolloutSession, rollout_session
    from agenttune.web.http_retry import RetryPolicy, send_with_retries
    from agenttune.workflow.base import Workflow, WorkflowOutput
    from agenttune.workflow.episode import (
        EnvironmentFailure,
        Episode,
        EpisodeStatus,
        Sample,
        fit_all,
        record_fitting,
    )
    from agenttune.workflow.task import Task, WorkflowTask
    from agenttune.workflow.tuner import ModelTuner

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
