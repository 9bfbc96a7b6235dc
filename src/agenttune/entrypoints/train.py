"""One code path for training, shared by the CLI and the Python API."""

from __future__ import annotations

from pathlib import Path

import agenttune.rollout.process_tree as process_tree
from agenttune.config.models import AgentTuneConfig
from agenttune.config.run import Run, get_logger, prepare_run
from agenttune.entrypoints.services import run_services
from agenttune.registry.resolution import preflight


def train_from_config(config: AgentTuneConfig, *, run_dir: Path | None = None, resume: bool = False) -> Run:
    components = preflight(config)  # every check happens before the run directory is created and weights load
    run = prepare_run(config, run_dir, resume=resume)
    run.components = components  # the backbone takes them from here: one resolution per run
    log = get_logger("train")
    log.info("run started", run_dir=str(run.run_dir), backbone=config.backbone)
    # What user code starts (and what a crashed worker leaves behind) stays in this tree and ends with the run.
    with process_tree.owning_leftovers(lambda killed: log.warning(
            "processes started during the run were still running at its end; killed them", processes=killed)):
        with run_services(config, run):  # environment servers and the like, from plugins
            components.backbone().run(run)
    return run
