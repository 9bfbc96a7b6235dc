"""What a plugin can rely on across agenttune releases: the plugin API's version, and for what moved
inside agenttune, where it lives now and the shims that keep the old import paths working.

A plugin imports agenttune through `agenttune.plugin_api` only (docs/plugins.md). Plugins written for
an earlier release may still import the modules their names used to live in. For one minor version
after a move, such an import works through a shim, with a `DeprecationWarning` that names the new
import; after that the shim goes, the entry here stays, and a plugin that fails on the old path is
told where the name lives now (`import_advice`, used when a plugin fails to load).

Nothing here imports the modules it names until an old path is imported: `import agenttune` stays light.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import warnings
from types import ModuleType
from typing import Any

# The release line whose plugin API this is, (major, minor): agenttune's own version's, since plugins
# pin agenttune's version (`agenttune>=0.2,<0.3`). A plugin that supports several lines can branch on it.
PLUGIN_API_VERSION: tuple[int, int] = (0, 2)


# The plugin API (agenttune.plugin_api): name -> (module, attribute). Grouped by what a plugin does with
# them. Here, at the bottom of the registry, so that the advice below reads it without importing
# plugin_api (which sits above every layer).
PLUGIN_API: dict[str, tuple[str, str]] = {
    # The release line of this API, for plugins to check (docs/plugins.md: the compatibility rules).
    "PLUGIN_API_VERSION": ("agenttune.registry.compatibility", "PLUGIN_API_VERSION"),
    # Registering components: the hook marker and the contracts the hooks return subclasses of.
    "hookimpl": ("agenttune.registry.hookspecs", "hookimpl"),
    "TaskReader": ("agenttune.components.readers.base", "TaskReader"),
    "AgentFramework": ("agenttune.components.frameworks.base", "AgentFramework"),
    "Judge": ("agenttune.components.judges.base", "Judge"),
    "Backbone": ("agenttune.components.backbone", "Backbone"),
    "InferenceEngine": ("agenttune.components.engines.base", "InferenceEngine"),
    "ToolParser": ("agenttune.components.parsers.base", "ToolParser"),
    "ReasoningParser": ("agenttune.components.parsers.base", "ReasoningParser"),
    "UserError": ("agenttune.errors", "UserError"),
    "AdvantageEstimator": ("agenttune.components.estimators.base", "AdvantageEstimator"),
    "PolicyLoss": ("agenttune.components.losses.base", "PolicyLoss"),
    # What flows through them.
    "Task": ("agenttune.workflow.task", "Task"),
    "WorkflowTask": ("agenttune.workflow.task", "WorkflowTask"),
    "Workflow": ("agenttune.workflow.base", "Workflow"),
    "WorkflowOutput": ("agenttune.workflow.base", "WorkflowOutput"),
    "ModelTuner": ("agenttune.workflow.tuner", "ModelTuner"),
    "FrameworkLoader": ("agenttune.rollout.framework_loader", "FrameworkLoader"),
    "JudgeInput": ("agenttune.components.judges.base", "JudgeInput"),
    "JudgeResult": ("agenttune.components.judges.base", "JudgeResult"),
    "Episode": ("agenttune.workflow.episode", "Episode"),
    "EpisodeStatus": ("agenttune.workflow.episode", "EpisodeStatus"),
    "EnvironmentFailure": ("agenttune.workflow.episode", "EnvironmentFailure"),
    "Sample": ("agenttune.workflow.episode", "Sample"),
    "fit_all": ("agenttune.workflow.episode", "fit_all"),
    "record_fitting": ("agenttune.workflow.episode", "record_fitting"),
    "Generation": ("agenttune.components.engines.base", "Generation"),
    "SamplingParams": ("agenttune.components.engines.base", "SamplingParams"),
    "FinishReason": ("agenttune.components.engines.base", "FinishReason"),
    "ToolParse": ("agenttune.components.parsers.base", "ToolParse"),
    "Scored": ("agenttune.components.estimators.base", "Scored"),
    "Advantages": ("agenttune.components.estimators.base", "Advantages"),
    "LossInput": ("agenttune.components.losses.base", "LossInput"),
    "LossOutput": ("agenttune.components.losses.base", "LossOutput"),
    # Configuration.
    "AgentTuneConfig": ("agenttune.config.models", "AgentTuneConfig"),
    "JudgeConfig": ("agenttune.config.models", "JudgeConfig"),
    "TaskReaderConfig": ("agenttune.config.models", "TaskReaderConfig"),
    "load_config": ("agenttune.registry.config_loading", "load_config"),
    "build_config": ("agenttune.registry.config_loading", "build_config"),
    "apply_overrides": ("agenttune.registry.config_loading", "apply_overrides"),
    "component_options": ("agenttune.registry.config_loading", "component_options"),
    "config_model": ("agenttune.registry.config_loading", "config_model"),
    "load_reference": ("agenttune.config.references", "load_reference"),
    "reference_for": ("agenttune.config.in_process", "reference_for"),
    "keep": ("agenttune.config.in_process", "keep"),
    # Finding components.
    "get_component": ("agenttune.registry.manager", "get_component"),
    "get_plugin_manager": ("agenttune.registry.manager", "get_plugin_manager"),
    "registered_plugin": ("agenttune.registry.manager", "registered_plugin"),
    "Components": ("agenttune.registry.resolution", "Components"),
    "resolve": ("agenttune.registry.resolution", "resolve"),
    # Backbones: a run, its rollouts and what they leave on disk.
    "Run": ("agenttune.config.run", "Run"),
    "prepare_run": ("agenttune.config.run", "prepare_run"),
    "configure_logging": ("agenttune.config.run", "configure_logging"),
    "get_logger": ("agenttune.config.run", "get_logger"),
    "missing_validation_split": ("agenttune.components.backbone", "missing_validation_split"),
    "RolloutSession": ("agenttune.rollout.session", "RolloutSession"),
    "rollout_session": ("agenttune.rollout.session", "rollout_session"),
    "RolloutEngine": ("agenttune.rollout.rollout_engine", "RolloutEngine"),
    "Gateway": ("agenttune.gateway", "Gateway"),
    "logprob_problem": ("agenttune.gateway.completions", "logprob_problem"),
    "RolloutLog": ("agenttune.rollout.log", "RolloutLog"),
    "TokenText": ("agenttune.rollout.log", "TokenText"),
    "read_records": ("agenttune.rollout.log", "read_records"),
    "to_record": ("agenttune.rollout.log", "to_record"),
    "MetricsLog": ("agenttune.rollout.metrics", "MetricsLog"),
    "step_metrics": ("agenttune.rollout.metrics", "step_metrics"),
    "resolve_model_path": ("agenttune.components.engines.model_loading", "resolve_model_path"),
    "Trainer": ("agenttune.entrypoints.python_api", "Trainer"),
    "with_changes": ("agenttune.entrypoints.python_api", "with_changes"),
    "train_from_config": ("agenttune.entrypoints.train", "train_from_config"),
    "serve": ("agenttune.entrypoints.serve", "serve"),
    "cli_app": ("agenttune.entrypoints.cli.main", "app"),
    "cli_main": ("agenttune.entrypoints.cli.main", "main"),
    # Built-in components a plugin builds on.
    "OpenAIEngine": ("agenttune.components.engines.openai", "OpenAIEngine"),
    "OpenAIEngineOptions": ("agenttune.components.engines.openai", "OpenAIEngineOptions"),
    "HFEngine": ("agenttune.components.engines.hf", "HFEngine"),
    "ScriptedEngine": ("agenttune.components.engines.scripted", "ScriptedEngine"),
    "scripted_logprob": ("agenttune.components.engines.scripted", "scripted_logprob"),
    "LLMJudge": ("agenttune.components.judges.llm_judge", "LLMJudge"),
    "LLMJudgeOptions": ("agenttune.components.judges.llm_judge", "LLMJudgeOptions"),
    "LLMJudgeError": ("agenttune.components.judges.llm_judge", "LLMJudgeError"),
    # Rollout correction: the local backbone's maths, which a backbone's own must match.
    "importance_weights": ("agenttune.backbones.local.rollout_correction", "importance_weights"),
    "rejection_mask": ("agenttune.backbones.local.rollout_correction", "rejection_mask"),
    # DAPO's overlong reward shaping (algorithm.overlong_shaping), which a backbone applies to its rewards.
    "OverlongShapingOptions": ("agenttune.config.objective_options", "OverlongShapingOptions"),
    # Talking to services; running one's server beside the run.
    "RetryPolicy": ("agenttune.web.http_retry", "RetryPolicy"),
    "ServiceProcess": ("agenttune.entrypoints.services", "ServiceProcess"),
    "exported_variable": ("agenttune.entrypoints.services", "exported_variable"),
    # A service started during an in-process run, on purpose, that must outlive it.
    "keep_after_run": ("agenttune.rollout.process_tree", "keep_after_run"),
    "send_with_retries": ("agenttune.web.http_retry", "send_with_retries"),
}


class MovedWarning(DeprecationWarning):
    """An old agenttune import path was used: it works through a shim for one more release line."""


# old module -> (where it lives now, the release line that moved it: its shim lasts that line)
MODULES: dict[str, tuple[str, str]] = {
    # Each plugin kind's contract moved beside its built-ins (<kind>/base.py).
    "agenttune.task_reader": ("agenttune.components.readers.base", "0.2"),
    "agenttune.judge": ("agenttune.components.judges.base", "0.2"),
    "agenttune.agent_framework": ("agenttune.components.frameworks.base", "0.2"),
    "agenttune.engine": ("agenttune.components.engines.base", "0.2"),
    "agenttune.backbone": ("agenttune.components.backbone", "0.2"),
    # What runs episodes moved into the rollout package.
    "agenttune.session": ("agenttune.rollout.session", "0.2"),
    "agenttune.rollout_log": ("agenttune.rollout.log", "0.2"),
    "agenttune.metrics": ("agenttune.rollout.metrics", "0.2"),
    "agenttune.rollout_gc": ("agenttune.rollout.gc", "0.2"),
    "agenttune.message_pipe": ("agenttune.rollout.pipe", "0.2"),
    "agenttune.workflow_processes": ("agenttune.rollout.workers", "0.2"),
    # Tool-call and reasoning parsers became plugin components.
    "agenttune.gateway.ids": ("agenttune.web.ids", "0.2"),
    "agenttune.gateway.tool_parsers": ("agenttune.components.parsers.hermes", "0.2"),
    "agenttune.gateway.reasoning": ("agenttune.components.parsers.think", "0.2"),
    # Within the 0.2 line: src/agenttune in 15 named rooms, one import-linter layer each (docs/architecture.md).
    # `agenttune.config` and `agenttune.workflow` became packages that still answer their old names;
    # `agenttune.components` is now the package of the plugin kinds (its old names: NAMES below).
    "agenttune.backbones.base": ("agenttune.components.backbone", "0.2"),
    "agenttune.backbones.local.trainer": ("agenttune.backbones.local.train_step", "0.2"),
    "agenttune.builtins": ("agenttune.entrypoints.builtins", "0.2"),
    "agenttune.cli": ("agenttune.entrypoints.cli", "0.2"),
    "agenttune.cli.config_cmd": ("agenttune.entrypoints.cli.config_cmd", "0.2"),
    "agenttune.cli.data_cmd": ("agenttune.entrypoints.cli.data_cmd", "0.2"),
    "agenttune.cli.logview_cmd": ("agenttune.entrypoints.cli.logview_cmd", "0.2"),
    "agenttune.cli.main": ("agenttune.entrypoints.cli.main", "0.2"),
    "agenttune.cli.model_cmd": ("agenttune.entrypoints.cli.model_cmd", "0.2"),
    "agenttune.cli.plugin_template": ("agenttune.entrypoints.cli.plugin_template", "0.2"),
    "agenttune.cli.plugins_cmd": ("agenttune.entrypoints.cli.plugins_cmd", "0.2"),
    "agenttune.cli.serve_cmd": ("agenttune.entrypoints.cli.serve_cmd", "0.2"),
    "agenttune.cli.train_cmd": ("agenttune.entrypoints.cli.train_cmd", "0.2"),
    "agenttune.compatibility": ("agenttune.registry.compatibility", "0.2"),
    "agenttune.component_base": ("agenttune.config.base", "0.2"),
    "agenttune.config_docs": ("agenttune.entrypoints.cli.config_docs", "0.2"),
    "agenttune.config_loader": ("agenttune.registry.config_loading", "0.2"),
    "agenttune.dataset_download": ("agenttune.components.readers.hub_download", "0.2"),
    "agenttune.engines": ("agenttune.components.engines", "0.2"),
    "agenttune.engines.base": ("agenttune.components.engines.base", "0.2"),
    "agenttune.engines.cuda_graphs": ("agenttune.components.engines.cuda_graphs", "0.2"),
    "agenttune.engines.grammar": ("agenttune.components.engines.grammar", "0.2"),
    "agenttune.engines.hf": ("agenttune.components.engines.hf", "0.2"),
    "agenttune.engines.lean_decoder": ("agenttune.components.engines.lean_decoder", "0.2"),
    "agenttune.engines.openai": ("agenttune.components.engines.openai", "0.2"),
    "agenttune.engines.sampling": ("agenttune.components.engines.sampling", "0.2"),
    "agenttune.engines.scripted": ("agenttune.components.engines.scripted", "0.2"),
    "agenttune.engines.stopping": ("agenttune.components.engines.stopping", "0.2"),
    "agenttune.engines.transformers_decoder": ("agenttune.components.engines.transformers_decoder", "0.2"),
    "agenttune.engines.vllm": ("agenttune.components.engines.vllm", "0.2"),
    "agenttune.engines.vllm_weights": ("agenttune.components.engines.vllm_weights", "0.2"),
    "agenttune.episode": ("agenttune.workflow.episode", "0.2"),
    "agenttune.estimators": ("agenttune.components.estimators", "0.2"),
    "agenttune.estimators.base": ("agenttune.components.estimators.base", "0.2"),
    "agenttune.estimators.outcome": ("agenttune.components.estimators.outcome", "0.2"),
    "agenttune.estimators.rejection": ("agenttune.components.estimators.rejection", "0.2"),
    "agenttune.estimators.turns": ("agenttune.components.estimators.turns", "0.2"),
    "agenttune.frameworks": ("agenttune.components.frameworks", "0.2"),
    "agenttune.frameworks.base": ("agenttune.components.frameworks.base", "0.2"),
    "agenttune.frameworks.openai": ("agenttune.components.frameworks.openai", "0.2"),
    "agenttune.gateway.errors": ("agenttune.gateway.api_errors", "0.2"),
    "agenttune.hookspecs": ("agenttune.registry.hookspecs", "0.2"),
    "agenttune.http_retry": ("agenttune.web.http_retry", "0.2"),
    "agenttune.ids": ("agenttune.web.ids", "0.2"),
    "agenttune.in_process": ("agenttune.config.in_process", "0.2"),
    "agenttune.install_hints": ("agenttune.config.install_hints", "0.2"),
    "agenttune.judges": ("agenttune.components.judges", "0.2"),
    "agenttune.judges.base": ("agenttune.components.judges.base", "0.2"),
    "agenttune.judges.llm_judge": ("agenttune.components.judges.llm_judge", "0.2"),
    "agenttune.logview.beside_training": ("agenttune.entrypoints.train_with_logview", "0.2"),
    "agenttune.loopback": ("agenttune.web.binding", "0.2"),
    "agenttune.losses": ("agenttune.components.losses", "0.2"),
    "agenttune.losses.base": ("agenttune.components.losses.base", "0.2"),
    "agenttune.losses.distillation": ("agenttune.components.losses.distillation", "0.2"),
    "agenttune.losses.policy_gradient": ("agenttune.components.losses.policy_gradient", "0.2"),
    "agenttune.losses.supervised": ("agenttune.components.losses.supervised", "0.2"),
    "agenttune.model_loading": ("agenttune.components.engines.model_loading", "0.2"),
    "agenttune.objective_options": ("agenttune.config.objective_options", "0.2"),
    "agenttune.parsers": ("agenttune.components.parsers", "0.2"),
    "agenttune.parsers.base": ("agenttune.components.parsers.base", "0.2"),
    "agenttune.parsers.hermes": ("agenttune.components.parsers.hermes", "0.2"),
    "agenttune.parsers.think": ("agenttune.components.parsers.think", "0.2"),
    "agenttune.plugins": ("agenttune.registry.manager", "0.2"),
    "agenttune.process_tree": ("agenttune.rollout.process_tree", "0.2"),
    "agenttune.pytest_plugin": ("agenttune.testing.pytest_plugin", "0.2"),
    "agenttune.readers": ("agenttune.components.readers", "0.2"),
    "agenttune.readers.base": ("agenttune.components.readers.base", "0.2"),
    "agenttune.readers.columns": ("agenttune.components.readers.columns", "0.2"),
    "agenttune.readers.deadline": ("agenttune.components.readers.deadline", "0.2"),
    "agenttune.readers.file": ("agenttune.components.readers.file", "0.2"),
    "agenttune.readers.huggingface": ("agenttune.components.readers.huggingface", "0.2"),
    "agenttune.readers.in_memory": ("agenttune.components.readers.in_memory", "0.2"),
    "agenttune.references": ("agenttune.config.references", "0.2"),
    "agenttune.rollout.engine": ("agenttune.rollout.rollout_engine", "0.2"),
    "agenttune.rollout.frameworks": ("agenttune.rollout.framework_loader", "0.2"),
    "agenttune.rollout_correction": ("agenttune.config.correction_options", "0.2"),
    "agenttune.run": ("agenttune.config.run", "0.2"),
    "agenttune.serve": ("agenttune.entrypoints.serve", "0.2"),
    "agenttune.services": ("agenttune.entrypoints.services", "0.2"),
    "agenttune.task": ("agenttune.workflow.task", "0.2"),
    "agenttune.tiny_model": ("agenttune.components.engines.tiny_model", "0.2"),
    "agenttune.trainer": ("agenttune.entrypoints.python_api", "0.2"),
    "agenttune.training": ("agenttune.entrypoints.train", "0.2"),
    "agenttune.tuner": ("agenttune.workflow.tuner", "0.2"),
    "agenttune.webserver": ("agenttune.web", "0.2"),
    "agenttune.webserver.connections": ("agenttune.web.connections", "0.2"),
    "agenttune.webserver.limits": ("agenttune.web.limits", "0.2"),
    "agenttune.webserver.requests": ("agenttune.web.requests", "0.2"),
}

# Names that left the module they were defined in (not with a whole module): name -> where it is now.
NAMES: dict[str, str] = {
    "NoOptions": "agenttune.config.base",
    "build_engine": "agenttune.registry.resolution",
    "engine_class": "agenttune.registry.resolution",
    "Components": "agenttune.registry.resolution",
    "resolve": "agenttune.registry.resolution",
    "preflight": "agenttune.registry.resolution",
    "resolve_task_reader": "agenttune.registry.resolution",
    "resolve_objective": "agenttune.registry.resolution",
}


def plugin_api_home(module: str) -> list[str]:
    """The plugin API's names that live in `module` (what a plugin should import instead)."""
    return sorted(name for name, (home, _) in PLUGIN_API.items() if home == module)


def in_plugin_api(name: str) -> bool:
    return name in PLUGIN_API


def _instead(names: list[str]) -> str:
    return f"`from agenttune.plugin_api import {', '.join(names)}`" if names else "agenttune.plugin_api"


def shim_warning(old: str) -> str:
    new, line = MODULES[old]
    major, minor = line.split(".")
    return (f"{old} moved to {new} in agenttune {line}; the old path works through {line}.x and is gone in "
            f"{major}.{int(minor) + 1}. Import from the plugin API instead: {_instead(plugin_api_home(new))} "
            f"(docs/plugins.md).")


class _Shim(ModuleType):
    """The old module path: every attribute is the new module's (or, for a name that moved on, its
    new home's)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system's own attributes (__loader__, __path__) are the shim's
            raise AttributeError(name)
        new = MODULES[self.__name__][0]
        module = importlib.import_module(new)
        if hasattr(module, name) or name not in NAMES:
            return getattr(module, name)
        return getattr(importlib.import_module(NAMES[name]), name)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(MODULES[self.__name__][0]))


class _ShimLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        shim = _Shim(spec.name)
        if spec.name + "." in _OLD_PACKAGES:  # an old package: its old submodules are found through it
            shim.__path__ = []
        return shim

    def exec_module(self, module: ModuleType) -> None:
        if hasattr(module, "__path__"):
            return  # an old package, imported as the parent of an old module: that module's import warns
        # stacklevel 2 skips the import machinery's frames: the warning points at the plugin's import.
        warnings.warn(shim_warning(module.__name__), MovedWarning, stacklevel=2)


class ShimFinder(importlib.abc.MetaPathFinder):
    """Asked last (after the real modules): finds only the old paths in MODULES."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _ShimLoader())


_OLD_PACKAGES = {old.rsplit(".", 1)[0] + "." for old in MODULES}


def install_shims() -> None:
    if not any(isinstance(finder, ShimFinder) for finder in sys.meta_path):
        sys.meta_path.append(ShimFinder())


_CANNOT_IMPORT = re.compile(r"cannot import name '(\w+)' from '(agenttune[\w.]*)'")


def import_advice(error: BaseException) -> str | None:
    """Where the agenttune name a plugin failed to import lives now, as one sentence; None when the
    error is not about an agenttune import."""
    if not isinstance(error, ImportError):
        return None
    missing = error.name or ""
    if isinstance(error, ModuleNotFoundError) and missing.startswith("agenttune."):
        if missing in MODULES:  # its shim has gone
            new = MODULES[missing][0]
            return (f"{missing} moved to {new} in agenttune {MODULES[missing][1]}: import from the plugin API "
                    f"instead, {_instead(plugin_api_home(new))} (docs/plugins.md).")
        return (f"agenttune has no module {missing}: a plugin imports agenttune through agenttune.plugin_api "
                f"(docs/plugins.md lists its names).")
    match = _CANNOT_IMPORT.search(str(error))
    if match is None:
        return None
    name, module = match.groups()
    if in_plugin_api(name):
        return f"{name} is not in {module}: import it from the plugin API, {_instead([name])}."
    where = f" (it lives in {NAMES[name]} now)" if name in NAMES else ""
    return (f"{name} is not in {module}{where}, and it is not part of the plugin API: a plugin imports "
            f"agenttune through agenttune.plugin_api only (docs/plugins.md lists its names).")
