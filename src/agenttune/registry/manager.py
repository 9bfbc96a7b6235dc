"""Finding plugins and the components they provide.

Plugins are entry points in the `agenttune` group; agenttune's built-ins are one of them. Each is
imported on first use of the registry, with per-plugin isolation: a plugin that fails to import or
whose hook raises is reported as broken and skipped, and the CLI keeps working.

Environment variables:
    AGENTTUNE_LOAD_PLUGINS     comma-separated allow list (entry-point or distribution names)
    AGENTTUNE_DISABLE_PLUGINS  comma-separated block list
    AGENTTUNE_TRACE_PLUGINS=1  print every hook call and what it returned to stderr
"""

from __future__ import annotations

import difflib
import itertools
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

import pluggy

from agenttune.config.base import NoOptions
from agenttune.config.install_hints import component_hint
from agenttune.errors import PluginError, PluginWarning
from agenttune.registry import compatibility, hookspecs

if TYPE_CHECKING:
    from agenttune.components.backbone import Backbone
    from agenttune.components.engines.base import InferenceEngine
    from agenttune.components.estimators.base import AdvantageEstimator
    from agenttune.components.frameworks.base import AgentFramework
    from agenttune.components.judges.base import Judge
    from agenttune.components.losses.base import PolicyLoss
    from agenttune.components.parsers.base import ReasoningParser, ToolParser
    from agenttune.components.readers.base import TaskReader

ENTRY_POINT_GROUP = "agenttune"
CORE_DISTRIBUTION = "agenttune"

# kind -> (hook name, what a user calls it)
KINDS: dict[str, tuple[str, str]] = {
    "task_readers": ("register_task_readers", "task reader"),
    "agent_frameworks": ("register_agent_frameworks", "agent framework"),
    "judges": ("register_judges", "judge"),
    "backbones": ("register_backbones", "backbone"),
    "engines": ("register_engines", "inference engine"),
    "tool_parsers": ("register_tool_parsers", "tool parser"),
    "reasoning_parsers": ("register_reasoning_parsers", "reasoning parser"),
    "advantage_estimators": ("register_advantage_estimators", "advantage estimator"),
    "policy_losses": ("register_policy_losses", "policy loss"),
}


@dataclass
class PluginInfo:
    """One plugin as `agenttune plugins list` shows it."""

    name: str
    distribution: str
    version: str
    module: str
    error: str | None = None
    hook_errors: list[str] = field(default_factory=list)
    deprecations: list[str] = field(default_factory=list)  # old agenttune imports it still uses (shims)
    provides: dict[str, list[str]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    config_sections: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "distribution": self.distribution,
            "module": self.module,
            **self.provides,
            "config_sections": self.config_sections,
            "error": self.problem,
            "deprecations": self.deprecations,
        }

    @property
    def problem(self) -> str | None:
        """The import error, else the hook errors, else None."""
        return self.error or ("; ".join(self.hook_errors) if self.hook_errors else None)


@dataclass
class Provided:
    cls: type
    plugin: PluginInfo


class PluginManager:
    """pluggy's manager plus the registry of named components, built once per process."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._components: dict[str, dict[str, Provided]] | None = None
        self._sections: dict[str, tuple[type, PluginInfo]] | None = None
        self._commands_added: dict[int, set[str]] = {}
        self.trace = os.environ.get("AGENTTUNE_TRACE_PLUGINS", "") not in ("", "0", "false")

    # -- loading -----------------------------------------------------------------------------
    def load_entry_points(self) -> None:
        allow = _names_from_env("AGENTTUNE_LOAD_PLUGINS")
        block = _names_from_env("AGENTTUNE_DISABLE_PLUGINS") or set()
        for entry_point in entry_points(group=ENTRY_POINT_GROUP):
            distribution = entry_point.dist.name if entry_point.dist else "unknown"
            is_core = distribution == CORE_DISTRIBUTION
            names = {entry_point.name, distribution}
            if not is_core and ((allow is not None and not names & allow) or names & block):
                continue
            self._load_entry_point(entry_point, distribution)

    def _load_entry_point(self, entry_point: EntryPoint, distribution: str) -> None:
        version = entry_point.dist.version if entry_point.dist else "?"
        info = PluginInfo(entry_point.name, distribution, version, entry_point.value)
        key = f"{distribution}:{entry_point.name}"
        self.plugins[key] = info
        if self.trace:
            print(f"[agenttune trace] load {entry_point.name} = {entry_point.value} ({distribution} {version})",
                  file=sys.stderr)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DeprecationWarning)
                module = entry_point.load()
            self.pm.register(module, name=key)
        except Exception as error:  # a broken plugin must not take the CLI down
            advice = compatibility.import_advice(error)
            info.error = f"{type(error).__name__}: {error}" + (f". {advice}" if advice else "")
            warnings.warn(f"agenttune plugin {entry_point.name!r} ({distribution}) failed to load: {info.error}",
                          PluginWarning, stacklevel=2)
            if self.trace:
                traceback.print_exc()
            return
        self._report_deprecations(info, caught)

    def _report_deprecations(self, info: PluginInfo, caught: list[warnings.WarningMessage]) -> None:
        """A plugin that loaded through an old import path (a shim) is told so on every run, not only
        under pytest: Python hides DeprecationWarnings raised outside __main__."""
        for warning in caught:
            if issubclass(warning.category, compatibility.MovedWarning):
                info.deprecations.append(str(warning.message))
                warnings.warn(f"agenttune plugin {info.name!r} ({info.distribution}) uses a deprecated import: "
                              f"{warning.message}", PluginWarning, stacklevel=3)
            else:  # not ours: as it would have been without the recording
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)

    def register(self, plugin: ModuleType | object, name: str, *, distribution: str = "(registered)",
                 version: str = "") -> None:
        """Register an in-process plugin (a module or object with hookimpls), e.g. from a test."""
        if name in self.plugins:
            raise ValueError(f"a plugin named {name!r} is already registered")
        self.pm.register(plugin, name=name)
        module = getattr(plugin, "__name__", type(plugin).__qualname__)
        self.plugins[name] = PluginInfo(name, distribution, version, module)
        self._forget_components()

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.plugins.pop(name, None)
        self._forget_components()

    def _forget_components(self) -> None:
        """Registration changed: collect components again on next use, with fresh per-plugin records."""
        self._components = None
        self._sections = None
        for info in self.plugins.values():
            # register_commands runs once per app, so its failures are kept; the rest are recomputed.
            info.hook_errors = [problem for problem in info.hook_errors if problem.startswith("register_commands")]
            info.provides = {kind: [] for kind in KINDS}
            info.config_sections = []

    # -- the registry --------------------------------------------------------------------------
    def _call(self, hook_name: str, *args: Any, skip: Collection[str] = ()) -> list[tuple[PluginInfo, Any]]:
        """Call one hook on every plugin separately, so results are attributed and failures isolated."""
        results = []
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            info = self.plugins.get(impl.plugin_name)
            if info is None or info.error or impl.plugin_name in skip:
                continue
            try:
                result = impl.function(*args)
            except Exception as error:  # isolate: the plugin's other hooks still count
                problem = f"{hook_name} raised {type(error).__name__}: {error}"
                info.hook_errors.append(problem)
                warnings.warn(f"agenttune plugin {info.name!r} ({info.distribution}) is broken: {problem}",
                              PluginWarning, stacklevel=2)
                if self.trace:
                    traceback.print_exc()
                continue
            if self.trace:
                print(f"[agenttune trace] {hook_name}() <- {info.name} ({info.distribution}): {result!r}",
                      file=sys.stderr)
            if result is not None:
                results.append((info, result))
        return results

    def components(self) -> dict[str, dict[str, Provided]]:
        if self._components is None:
            self._components = {kind: self._collect(kind) for kind in KINDS}
        return self._components

    def _collect(self, kind: str) -> dict[str, Provided]:
        hook_name, label = KINDS[kind]
        found: dict[str, Provided] = {}
        for info, classes in self._call(hook_name):
            for cls in [classes] if isinstance(classes, type) else classes:
                name = getattr(cls, "name", "")
                if not name:
                    raise PluginError(f"Plugin {info.name!r} ({info.distribution}) registers a {label} "
                                      f"class {cls.__qualname__} without a `name`.",
                                      hint="Give the class a unique `name` class attribute.")
                if name in found and found[name].cls is not cls:
                    other = found[name].plugin
                    raise PluginError(
                        f"Two plugins provide a {label} named {name!r}: {other.distribution} "
                        f"(plugin {other.name!r}) and {info.distribution} (plugin {info.name!r}).",
                        hint="Uninstall one of them, or disable one with AGENTTUNE_DISABLE_PLUGINS=<name>.",
                    )
                found[name] = Provided(cls, info)
                info.provides[kind].append(name)
        return found

    def get(self, kind: str, name: str, *, key: str | None = None) -> type:
        """The class registered as `name`, or a PluginError that lists what is available."""
        provided = self.components()[kind]
        if name in provided:
            return provided[name].cls
        label = KINDS[kind][1]
        available = ", ".join(sorted(provided)) or "none"
        where = f"{key}: " if key else ""
        close = difflib.get_close_matches(str(name), list(provided), n=1)
        guess = f" Did you mean {close[0]!r}?" if close else ""
        broken = [info for info in self.plugins.values() if info.problem]
        if not broken:
            raise PluginError(f"{where}unknown {label} {name!r}. Available: {available}.{guess}",
                              hint=component_hint(kind, name))
        # It may well be installed: a plugin that failed to load provides nothing.
        problems = "; ".join(f"{info.name} ({info.distribution}): {info.problem}" for info in broken)
        raise PluginError(f"{where}unknown {label} {name!r}. Available: {available}.{guess} Installed plugins that "
                          f"failed to load, and so provide nothing: {problems}",
                          hint="If one of them provides it, fix that plugin (what failed is above; `agenttune plugins "
                               f"list` shows it too). Otherwise: {component_hint(kind, name)}")

    def names(self, kind: str) -> list[str]:
        return sorted(self.components()[kind])

    def config_sections(self) -> dict[str, type]:
        """Top-level config sections the plugins own: each backbone's `Options` under the backbone's
        name, and the models of `register_config_sections`. One model may be registered under one
        name by several plugins (one section, shared); two different models may not."""
        if self._sections is None:
            found: dict[str, tuple[type, PluginInfo]] = {}
            for info, sections in self._call("register_config_sections"):
                for section, model in sections.items():
                    _add_section(found, section, model, info)
            for name, backbone in self.components()["backbones"].items():
                options = getattr(backbone.cls, "Options", NoOptions)
                if options is not NoOptions:
                    _add_section(found, name, options, backbone.plugin)
            self._sections = found
        return {section: model for section, (model, _) in self._sections.items()}

    def register_commands(self, app: Any) -> None:
        """Let plugins add CLI sub-commands; each plugin is asked once per app."""
        done = self._commands_added.setdefault(id(app), set())
        skip = set(done)
        done.update(impl.plugin_name for impl in self.pm.hook.register_commands.get_hookimpls())
        self._call("register_commands", app, skip=skip)

    def infos(self) -> list[PluginInfo]:
        self.components()
        self.config_sections()
        return sorted(self.plugins.values(), key=lambda info: (info.distribution != CORE_DISTRIBUTION, info.name))


def _add_section(found: dict[str, tuple[type, PluginInfo]], section: str, model: type, info: PluginInfo) -> None:
    if section in found and found[section][0] is not model:
        other = found[section][1]
        raise PluginError(f"Plugins {other.distribution} and {info.distribution} both define the config "
                          f"section {section!r}, with different models.",
                          hint="Uninstall or disable one of them.")
    found.setdefault(section, (model, info))
    if section not in info.config_sections:
        info.config_sections.append(section)


def _names_from_env(variable: str) -> set[str] | None:
    value = os.environ.get(variable)
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


@cache
def get_plugin_manager() -> PluginManager:
    manager = PluginManager()
    manager.load_entry_points()
    return manager


@overload
def get_component(kind: Literal["task_readers"], name: str, *, key: str | None = None) -> type[TaskReader]: ...
@overload
def get_component(kind: Literal["agent_frameworks"], name: str, *,
                  key: str | None = None) -> type[AgentFramework]: ...
@overload
def get_component(kind: Literal["judges"], name: str, *, key: str | None = None) -> type[Judge]: ...
@overload
def get_component(kind: Literal["backbones"], name: str, *, key: str | None = None) -> type[Backbone]: ...
@overload
def get_component(kind: Literal["engines"], name: str, *, key: str | None = None) -> type[InferenceEngine]: ...
@overload
def get_component(kind: Literal["tool_parsers"], name: str, *, key: str | None = None) -> type[ToolParser]: ...
@overload
def get_component(kind: Literal["reasoning_parsers"], name: str, *,
                  key: str | None = None) -> type[ReasoningParser]: ...
@overload
def get_component(kind: Literal["advantage_estimators"], name: str, *,
                  key: str | None = None) -> type[AdvantageEstimator]: ...
@overload
def get_component(kind: Literal["policy_losses"], name: str, *, key: str | None = None) -> type[PolicyLoss]: ...
@overload
def get_component(kind: str, name: str, *, key: str | None = None) -> type: ...
def get_component(kind: str, name: str, *, key: str | None = None) -> type:
    """The class registered as `name` among the `kind`s (typed by the hook's contract: the hooks
    return subclasses of TaskReader, AgentFramework, Judge, Backbone, InferenceEngine, ToolParser,
    ReasoningParser, AdvantageEstimator and PolicyLoss)."""
    return get_plugin_manager().get(kind, name, key=key)


def make_plugin(
    *,
    task_readers: Sequence[type] = (),
    agent_frameworks: Sequence[type] = (),
    judges: Sequence[type] = (),
    backbones: Sequence[type] = (),
    engines: Sequence[type] = (),
    tool_parsers: Sequence[type] = (),
    reasoning_parsers: Sequence[type] = (),
    advantage_estimators: Sequence[type] = (),
    policy_losses: Sequence[type] = (),
    config_sections: dict[str, type] | None = None,
    commands: Callable[[Any], Any] | None = None,
) -> object:
    """A plugin object implementing the hooks for the classes given (for tests and in-process use)."""
    hookimpl = hookspecs.hookimpl
    returns = {"task_readers": task_readers, "agent_frameworks": agent_frameworks, "judges": judges,
               "backbones": backbones, "engines": engines, "tool_parsers": tool_parsers,
               "reasoning_parsers": reasoning_parsers, "advantage_estimators": advantage_estimators,
               "policy_losses": policy_losses}
    namespace: dict[str, Any] = {}
    for kind, classes in returns.items():
        if classes:
            namespace[KINDS[kind][0]] = hookimpl(_returning(list(classes)))
    if config_sections:
        namespace["register_config_sections"] = hookimpl(_returning(dict(config_sections)))
    if commands is not None:
        namespace["register_commands"] = hookimpl(lambda app: commands(app))
    return type("InProcessPlugin", (), {name: staticmethod(function) for name, function in namespace.items()})()


def _returning(value: Any) -> Callable[[], Any]:
    return lambda: value


_plugin_numbers = itertools.count(1)


@contextmanager
def registered_plugin(plugin: object | None = None, *, name: str | None = None,
                      distribution: str = "(test)", **provides: Any) -> Iterator[object]:
    """Register a plugin for the duration of a `with` block.

    Pass a module or object with `@hookimpl` functions, or the classes it provides as keywords
    (`backbones=[MyBackbone]`, see `make_plugin`).
    """
    if plugin is None:
        plugin = make_plugin(**provides)
    elif provides:
        raise TypeError("pass either a plugin object or the classes it provides, not both")
    name = name or f"test-plugin-{next(_plugin_numbers)}"
    manager = get_plugin_manager()
    manager.register(plugin, name=name, distribution=distribution)
    try:
        yield plugin
    finally:
        manager.unregister(name)
