"""The run's agent frameworks, created once each: what a `ModelTuner` asks for `tuner.as_model(name)`."""

from __future__ import annotations

from typing import Any

from agenttune.frameworks.base import AgentFramework
from agenttune.plugins import get_component


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
