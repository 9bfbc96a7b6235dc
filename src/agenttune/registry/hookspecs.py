"""The hook specifications every agenttune plugin implements.

A plugin is an installed distribution with an entry point in the `agenttune` group pointing at a
module that implements some of these hooks with `@agenttune.hookimpl`. The `register_*` hooks return
classes (not instances); each class has a unique `name`. Keep plugin modules light: import heavy
libraries (torch, verl, agent frameworks) inside methods so that `agenttune --help` stays fast.

Every hook here is documented in docs/plugins.md (a test checks it): add the docs with the hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import typer
    from pydantic import BaseModel

    from agenttune.config.models import AgentTuneConfig
    from agenttune.config.run import Run

hookspec = pluggy.HookspecMarker("agenttune")
hookimpl = pluggy.HookimplMarker("agenttune")


@hookspec
def register_task_readers() -> list[type] | None:
    """Return `TaskReader` subclasses; their `name` is what `task_reader.type` selects."""


@hookspec
def register_agent_frameworks() -> list[type] | None:
    """Return `AgentFramework` subclasses; their `name` is what `--agent` and `tuner.as_model()` select."""


@hookspec
def register_judges() -> list[type] | None:
    """Return `Judge` subclasses; their `name` is what `judge.type` selects."""


@hookspec
def register_backbones() -> list[type] | None:
    """Return `Backbone` subclasses; their `name` is what `--backbone` selects, and their `Options`
    (when not `NoOptions`) is the top-level config section of that name."""


@hookspec
def register_engines() -> list[type] | None:
    """Return `InferenceEngine` subclasses; their `name` is what `engine.type` selects."""


@hookspec
def register_tool_parsers() -> list[type] | None:
    """Return `ToolParser` subclasses; their `name` is what `gateway.tool_parser` selects."""


@hookspec
def register_reasoning_parsers() -> list[type] | None:
    """Return `ReasoningParser` subclasses; their `name` is what `gateway.reasoning_parser` selects."""


@hookspec
def register_advantage_estimators() -> list[type] | None:
    """Return `AdvantageEstimator` subclasses; their `name` is what `algorithm.adv_estimator` selects."""


@hookspec
def register_policy_losses() -> list[type] | None:
    """Return `PolicyLoss` subclasses; their `name` is what `algorithm.policy_loss` selects."""


@hookspec
def register_config_sections() -> dict[str, type[BaseModel]] | None:
    """Return extra top-level config sections this plugin owns, as `{section_name: pydantic model}`.

    The section is validated with the model and available as `config.section(name, model)`. One
    model may be registered under one name by several plugins; different models under one name are
    an error.
    """


@hookspec
def run_services(config: AgentTuneConfig, run: Run) -> AbstractContextManager[Any] | None:
    """Return a context manager for a service this run needs (an environment server, ...), or None.

    `agenttune train` enters every returned manager before the backbone starts and exits them, in
    reverse order, when the run ends however it ends (see agenttune.entrypoints.services).
    """


@hookspec
def register_commands(app: typer.Typer) -> Any:
    """Add CLI sub-commands to the `agenttune` Typer app (for example a plugin's own tools)."""
