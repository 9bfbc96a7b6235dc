"""`agenttune train --with-logview`: the viewer on the run directory while the run goes on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agenttune.logview.server import DEFAULT_PORT, start_in_background

if TYPE_CHECKING:
    from agenttune.config.models import AgentTuneConfig


def train_with_logview(config: AgentTuneConfig, *, run_dir: Path | None, resume: bool,
                       port: int = DEFAULT_PORT) -> None:
    """Train as `train_from_config` does, with a viewer on the run directory from the start.

    The viewer starts before the run directory exists (it shows the run once it does) and stays up
    after training ends, until Ctrl-C: a debug run is over in seconds, and its log is what you came for.
    """
    from agenttune.config.run import choose_run_dir
    from agenttune.entrypoints.train import train_from_config

    run_dir = choose_run_dir(config, run_dir, resume=resume)
    viewer = start_in_background(run_dir, port=port, fall_back_to_free_port=True)
    print(f"Log viewer: {viewer.url} (run directory {run_dir})", flush=True)
    try:
        train_from_config(config, run_dir=run_dir, resume=resume)
    except BaseException:
        viewer.stop()
        raise
    print(f"Training finished. The log viewer is still at {viewer.url}: press Ctrl-C to stop it.", flush=True)
    viewer.wait()
