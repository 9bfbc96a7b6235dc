"""The run's agent frameworks, created once each: what a `ModelTuner` asks for `tuner.as_model(name)`."""

from __future__ import annotations

from typing import Any

from agenttune.components.frameworks.base import AgentFramework
from agenttune.errors import PluginError
from agenttune.registry.manager import get_component, get_plugin_manager


class FrameworkLoader:
    """Creates each agent framework once per run, calling its `setup(run_dir)` first."""

    def __init__(self, run_dir: Any = None):
        self.run_dir = run_dir
        self._frameworks: dict[str, AgentFramework] = {}

    def get(self, name: str) -> AgentFramework:
        if name not in self._frameworks:
            framework = get_component("agent_frameworks", name, key="tuner.as_model")()
            if self.run_dir is not None:
                framework.setup(self.run_dir)
            self._frameworks[name] = framework
        return self._frameworks[name]

    def provider_of(self, method: str) -> str | None:
        """The agent framework that adds `tuner.<method>` (its `tuner_methods`), None when none does.

        Read from the registered classes, not from `get`: looking a method up must not set up a
        framework the workflow never asked for.
        """
        providers = [name for name in get_plugin_manager().names("agent_frameworks")
                     if method in _tuner_methods(get_component("agent_frameworks", name))]
        if len(providers) > 1:
            raise PluginError(f"tuner.{method}: the agent frameworks {' and '.join(providers)} both add it.",
                              hint="Uninstall or disable one of their plugins (AGENTTUNE_DISABLE_PLUGINS="
                                   f"<name>), or call tuner.as_model({providers[0]!r}, ...) instead.")
        return providers[0] if providers else None


def _tuner_methods(framework: type) -> tuple[str, ...]:
    # getattr: a framework class that does not subclass AgentFramework (the hook only asks for one) adds none.
    return tuple(getattr(framework, "tuner_methods", ()))
