"""The agenttune side of a Trinity workflow runner: config, gateway, judge and rollout engine.

Trinity creates workflows inside its workflow-runner processes (Ray actors), one runner per slot,
each with its own `ModelWrapper`. The first agenttune task a runner gets builds the rollout stack
(`agenttune.rollout.session.rollout_session`) around a `TrinityEngine` on that runner's rollout model; it is
kept for the life of the process, so the tokenizer is loaded and the gateway started once per runner,
not once per task.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agenttune.plugin_api import AgentTuneConfig, RolloutSession, Run, UserError, configure_logging
from agenttune_trinity.engine import TrinityEngine


@dataclass
class AgentTuneStack:
    session: RolloutSession
    run: Run
    exit_stack: AsyncExitStack

    @property
    def config(self) -> AgentTuneConfig:
        return self.session.config

    async def aclose(self) -> None:
        await self.exit_stack.aclose()


_stacks: dict[tuple[str, int], AgentTuneStack] = {}
_lock = asyncio.Lock()


def load_run_config(run_dir: Path, source_dir: str | None = None) -> AgentTuneConfig:
    """The run's resolved configuration, as `agenttune train` wrote it to `<run_dir>/config.yaml`.

    Environment variables are not consulted again: the run is what the driver resolved.
    """
    from agenttune.plugin_api import config_model

    path = run_dir / "config.yaml"
    if not path.exists():
        raise UserError(f"The agenttune run directory {str(run_dir)!r} has no config.yaml; the Trinity workflow "
                        "cannot rebuild the agenttune side without it.",
                        hint="Start training with `agenttune train --backbone trinity`, which writes it, and keep "
                             "the run directory on storage every Ray node can read.")
    config = config_model().model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    if source_dir:
        config._source_dir = Path(source_dir)
    return config


async def stack_for(model: Any, workflow_args: dict[str, Any]) -> AgentTuneStack:
    """The stack of this runner process for `model` (built on first use)."""
    run_dir = Path(_required(workflow_args, "agenttune_run_dir"))
    key = (str(run_dir), id(model))
    async with _lock:
        if key not in _stacks:
            _stacks[key] = await _open(model, run_dir, workflow_args.get("agenttune_source_dir"))
        return _stacks[key]


async def close_all() -> None:
    """Close every stack of this process (tests; Trinity never tears workflows down)."""
    async with _lock:
        while _stacks:
            _, stack = _stacks.popitem()
            await stack.aclose()


async def _open(model: Any, run_dir: Path, source_dir: str | None) -> AgentTuneStack:
    from agenttune.plugin_api import rollout_session

    config = load_run_config(run_dir, source_dir)
    configure_logging(run_dir / "log.jsonl")
    run = Run(config=config, run_dir=run_dir)
    exit_stack = AsyncExitStack()
    try:
        engine = TrinityEngine.for_model(model, timeout=config.rollout.episode_timeout)
        exit_stack.push_async_callback(engine.aclose)
        session = await exit_stack.enter_async_context(rollout_session(config, run=run, engine=engine))
    except BaseException:
        await exit_stack.aclose()
        raise
    return AgentTuneStack(session, run, exit_stack)


def _required(workflow_args: dict[str, Any], key: str) -> str:
    value = workflow_args.get(key)
    if not value:
        raise UserError(f"Trinity's workflow_args has no {key!r}, so the agenttune workflow cannot find its run.",
                        hint="Let the trinity backbone write the taskset config; do not replace "
                             "trinity.buffer.explorer_input.taskset.workflow_args.")
    return str(value)
