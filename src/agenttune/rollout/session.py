"""The rollout stack every backbone stands on: tokenizer, engine, gateway, judge, rollout engine.

    async with rollout_session(config, run=run) as session:
        tasks = session.tasks(config.task_reader.train_split, limit=8)
        episodes = await session.rollout.run_tasks(tasks)
        metrics = session.record(step=1, split="train", episodes=episodes)

A backbone that brings its own inference engine (verl's or Trinity's rollout servers, the local
backbone's in-process model) passes it as `engine=`; the session then leaves closing it to its
owner. Everything the session built is closed on exit, also when the body raises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agenttune.errors import UserError
from agenttune.rollout.framework_loader import FrameworkLoader
from agenttune.rollout.log import RolloutLog
from agenttune.rollout.metrics import MetricsLog, step_metrics
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.rollout.running import run_until_done as run_until_done  # for backbones (docs/rollouts.md)
from agenttune.workflow.task import Task

if TYPE_CHECKING:
    from agenttune.components.engines.base import InferenceEngine
    from agenttune.components.judges.base import Judge
    from agenttune.config.models import AgentTuneConfig
    from agenttune.config.run import Run
    from agenttune.registry.resolution import Components
    from agenttune.workflow.episode import Episode

VALIDATION = "validation"


@dataclass
class RolloutSession:
    config: AgentTuneConfig
    components: Components
    tokenizer: Any
    engine: InferenceEngine
    gateway: Any
    judge: Judge | None
    rollout: RolloutEngine
    run: Run | None = None

    @property
    def rollout_log(self) -> RolloutLog | None:
        return RolloutLog.for_run(self.run) if self.run is not None else None

    @property
    def metrics_log(self) -> MetricsLog | None:
        return MetricsLog(self.run.metrics_path) if self.run is not None else None

    def tasks(self, split: str, *, limit: int | None = None) -> list[Task]:
        """The tasks of `split` from the configured reader (the first `limit` of them)."""
        tasks = list(self.components.read_tasks(split, limit=limit))
        if not tasks:
            raise UserError(f"The task reader ({self.config.task_reader.type!r}) found no tasks in split {split!r}.",
                            hint="Check task_reader's settings and the split names (task_reader.train_split).")
        return tasks

    def record(self, step: int, split: str, episodes: list[Episode]) -> dict[str, float]:
        """Write the episodes to the rollout log; return their step metrics (`val/…` for validation).

        Backbones add their own metrics (loss, KL, …) and write the step with `metrics_log.write`.
        """
        if self.rollout_log is not None:
            self.rollout_log.write(step, split, episodes, self.tokenizer)
        return step_metrics(episodes, prefix="val/" if split == VALIDATION else "")


@asynccontextmanager
async def rollout_session(
    config: AgentTuneConfig,
    *,
    run: Run | None = None,
    components: Components | None = None,
    engine: InferenceEngine | None = None,
    tokenizer: Any = None,
    max_parallel: int | None = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> AsyncIterator[RolloutSession]:
    """Build the rollout stack for `config`, start the gateway, and tear it all down on exit.

    `engine`/`tokenizer`: bring your own (otherwise built from `config.engine` / `config.model`).
    `max_parallel`: episodes at once (default `rollout.max_env_worker`).
    """
    from agenttune.components.engines.model_loading import load_tokenizer
    from agenttune.gateway import Gateway
    from agenttune.registry.resolution import build_engine, components_for, resolve

    components = components or (components_for(run) if run is not None else resolve(config))
    if components.workflow_cls is None:
        raise UserError("workflow is not set.", hint="Add `workflow: my_package.my_module:MyWorkflow` to the config.")
    async with AsyncExitStack() as stack:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model)
        if engine is None:
            engine = build_engine(config, tokenizer)
            stack.push_async_callback(engine.aclose)
        judge = components.judge()
        if judge is not None:
            stack.push_async_callback(judge.aclose)
        gateway = Gateway(engine, tokenizer, config)
        await gateway.start()
        stack.push_async_callback(gateway.stop)
        frameworks = FrameworkLoader(run.run_dir if run is not None else None)
        frameworks.get(config.agent_framework)  # its setup() runs before the first episode
        rollout = RolloutEngine(config, gateway, components.workflow_cls, judge, frameworks=frameworks,
                                max_parallel=max_parallel, on_episode=on_episode)
        stack.push_async_callback(rollout.aclose)
        yield RolloutSession(config, components, tokenizer, engine, gateway, judge, rollout, run)
