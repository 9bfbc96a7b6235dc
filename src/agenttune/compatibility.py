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


class MovedWarning(DeprecationWarning):
    """An old agenttune import path was used: it works through a shim for one more release line."""


# old module -> (where it lives now, the release line that moved it: its shim lasts that line)
MODULES: dict[str, tuple[str, str]] = {
    # Each plugin kind's contract moved beside its built-ins (<kind>/base.py).
    "agenttune.task_reader": ("agenttune.readers.base", "0.2"),
    "agenttune.judge": ("agenttune.judges.base", "0.2"),
    "agenttune.agent_framework": ("agenttune.frameworks.base", "0.2"),
    "agenttune.engine": ("agenttune.engines.base", "0.2"),
    "agenttune.backbone": ("agenttune.backbones.base", "0.2"),
    # What runs episodes moved into the rollout package.
    "agenttune.session": ("agenttune.rollout.session", "0.2"),
    "agenttune.rollout_log": ("agenttune.rollout.log", "0.2"),
    "agenttune.metrics": ("agenttune.rollout.metrics", "0.2"),
    "agenttune.rollout_gc": ("agenttune.rollout.gc", "0.2"),
    "agenttune.message_pipe": ("agenttune.rollout.pipe", "0.2"),
    "agenttune.workflow_processes": ("agenttune.rollout.workers", "0.2"),
    # Tool-call and reasoning parsers became plugin components.
    "agenttune.gateway.ids": ("agenttune.ids", "0.2"),
    "agenttune.gateway.tool_parsers": ("agenttune.parsers.hermes", "0.2"),
    "agenttune.gateway.reasoning": ("agenttune.parsers.think", "0.2"),
}

# Names that left the module they were defined in (not with a whole module): name -> where it is now.
NAMES: dict[str, str] = {
    "NoOptions": "agenttune.component_base",
    "build_engine": "agenttune.components",
    "engine_class": "agenttune.components",
}


def plugin_api_home(module: str) -> list[str]:
    """The plugin API's names that live in `module` (what a plugin should import instead)."""
    # By name, when a message needs it: the plugin API sits above every layer of agenttune, and this
    # module, at the bottom, only reads its table to word a warning or an error.
    table: dict[str, tuple[str, str]] = importlib.import_module("agenttune.plugin_api")._WHERE
    return sorted(name for name, (home, _) in table.items() if home == module)


def in_plugin_api(name: str) -> bool:
    return name in importlib.import_module("agenttune.plugin_api").__all__


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
        return _Shim(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        # stacklevel 2 skips the import machinery's frames: the warning points at the plugin's import.
        warnings.warn(shim_warning(module.__name__), MovedWarning, stacklevel=2)


class ShimFinder(importlib.abc.MetaPathFinder):
    """Asked last (after the real modules): finds only the old paths in MODULES."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _ShimLoader())


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
