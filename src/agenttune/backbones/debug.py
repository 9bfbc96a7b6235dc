"""The `debug` backbone: roll out and judge a few tasks in the main process, train nothing.

No Ray, no subprocesses: breakpoints in a workflow or judge stop right there (`debug.max_parallel: 1`
runs one episode at a time). It runs the first `debug.first_n_tasks` train tasks, each
`rollout.num_repeat` times, prints one table row per episode, and writes the rollout log and
`metrics.jsonl` exactly as the training backbones do (as step 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from agenttune.components.backbone import Backbone
from agenttune.config.base import Section

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from agenttune.config.run import Run
    from agenttune.workflow.episode import Episode

STEP = 1


class DebugOptions(Section):
    """The `debug:` section."""

    first_n_tasks: int = Field(default=4, gt=0, description="The debug backbone runs the first N train tasks.")
    max_parallel: int = Field(default=4, gt=0, description="Episodes at once in debug (1: one at a time, for breakpoints).")


class DebugBackbone(Backbone):
    name: ClassVar[str] = "debug"
    description: ClassVar[str] = "Roll out and judge the first tasks in the main process: no training, no Ray."
    Options: ClassVar[type[DebugOptions]] = DebugOptions

    def run(self, run: Run) -> None:
        from agenttune.rollout.session import run_until_done

        run_until_done(self.roll_out(run))

    async def roll_out(self, run: Run) -> list[Episode]:
        from rich.console import Console

        from agenttune.rollout.session import rollout_session

        config = run.config
        options = config.section(self.name, DebugOptions)
        console = Console(highlight=False)
        async with rollout_session(config, run=run, max_parallel=options.max_parallel,
                                   on_episode=lambda episode: console.print(episode_line(episode))) as session:
            tasks = session.tasks(config.task_reader.train_split, limit=options.first_n_tasks)
            console.print(f"Rolling out {len(tasks)} task(s) x {config.rollout.num_repeat} "
                          f"({options.max_parallel} at once) ...")
            episodes = await session.rollout.run_tasks(tasks)
            metrics = session.record(STEP, "train", episodes)
            metrics_log, rollout_log = session.metrics_log, session.rollout_log
            assert metrics_log is not None and rollout_log is not None  # (the session was given the run)
            metrics_log.write(STEP, metrics)
        console.print(episode_table(episodes))
        print_failures(console, episodes)
        console.print(f"reward mean {metrics['reward/mean']:.3f} · success {metrics['success_rate']:.0%} · "
                      f"failed {metrics['failure_rate']:.0%} · rollout log: {rollout_log.path(STEP, 'train')}")
        return episodes


def episode_line(episode: Episode) -> str:
    mark = "[red]✗[/]" if episode.status.failed else "[green]✓[/]"
    return (f"{mark} {episode.task.task_id} #{episode.repeat_index}: {episode.status.value}, "
            f"reward {episode.reward:g}, {int(episode.metrics.get('calls', 0))} turn(s), {episode.duration_s:.1f}s")


def episode_table(episodes: list[Episode]) -> Table:
    from rich.table import Table

    table = Table(title=f"{len(episodes)} episodes", caption="tokens: prompt / generated / trained")
    table.add_column("task", overflow="fold")
    table.add_column("#", justify="right")
    table.add_column("status")
    for column in ("reward", "success", "turns", "tokens", "s"):
        table.add_column(column, justify="right", no_wrap=True)
    for episode in episodes:
        trained = sum(sample.num_trained_tokens for sample in episode.trainable_samples)
        tokens = (f"{int(episode.metrics.get('prompt_tokens', 0))}/"
                  f"{int(episode.metrics.get('generated_tokens', 0))}/{trained}")
        status = f"[red]{episode.status.value}[/]" if episode.status.failed else episode.status.value
        table.add_row(episode.task.task_id, str(episode.repeat_index), status, f"{episode.reward:g}",
                      "yes" if episode.success else "no", str(int(episode.metrics.get("calls", 0))), tokens,
                      f"{episode.duration_s:.1f}")
    return table


def print_failures(console: Console, episodes: list[Episode]) -> None:
    """The first failure of each kind, with its traceback: enough to start fixing."""
    seen: set[str] = set()
    for episode in episodes:
        if episode.status.failed and episode.status.value not in seen:
            seen.add(episode.status.value)
            console.print(f"[bold red]{episode.status.value}[/] in task {episode.task.task_id} "
                          f"#{episode.repeat_index}:", markup=True)
            console.print(episode.error or "", markup=False, highlight=False)
