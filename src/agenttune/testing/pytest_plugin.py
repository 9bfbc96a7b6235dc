"""pytest fixtures for agenttune and its plugins.

Installed as a pytest plugin (the `pytest11` entry point), so every test suite in an environment with
agenttune gets them without a conftest import:

    def test_my_backbone_is_found(register_plugin):
        register_plugin(backbones=[MyBackbone])
        assert get_component("backbones", "mine") is MyBackbone

Keep this module's imports light: pytest loads it at start-up in every such environment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest


@pytest.fixture
def register_plugin() -> Iterator[Callable[..., object]]:
    """Register plugins for the duration of one test.

    Call it with a module or object holding `@agenttune.hookimpl` functions, or with the classes the
    plugin provides as keywords (task_readers, agent_frameworks, judges, backbones, engines,
    tool_parsers, reasoning_parsers, advantage_estimators, policy_losses, config_sections, commands). `name=` and `distribution=` set how the plugin is listed. Every plugin
    registered this way is unregistered when the test ends.
    """
    from agenttune.registry.manager import registered_plugin

    with ExitStack() as stack:

        def register(plugin: object | None = None, **options: Any) -> object:
            return stack.enter_context(registered_plugin(plugin, **options))

        yield register
