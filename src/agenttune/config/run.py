"""A run directory and the logging that goes with it.

Layout of `<run_dir>`:
    config.yaml        the resolved configuration
    log.jsonl          structured log (JSON lines)
    metrics.jsonl      one JSON object per step (written by backbones)
    rollouts/          rollout log, one JSONL file per step (see agenttune.rollout.log)
    checkpoints/       checkpoints (local backbone)
Nothing is written outside the run directory unless the user asks for it.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml

from agenttune.config.models import AgentTuneConfig
from agenttune.errors import UserError


@dataclass
class Run:
    config: AgentTuneConfig
    run_dir: Path
    resume: bool = False
    # What `preflight` resolved for this run (agenttune.registry.resolution.Components), carried to the
    # backbone so that a run resolves its components once: backbones read it with `components_for(run)`.
    components: Any = None

    @property
    def rollouts_dir(self) -> Path:
        return self.run_dir / "rollouts"

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "log.jsonl"


def default_run_dir(config: AgentTuneConfig, base: Path = Path("runs")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return base / config.project_name / config.experiment_name / stamp


def latest_run_dir(config: AgentTuneConfig, base: Path = Path("runs")) -> Path | None:
    parent = base / config.project_name / config.experiment_name
    runs = sorted(path for path in parent.glob("*") if path.is_dir()) if parent.exists() else []
    return runs[-1] if runs else None


def choose_run_dir(config: AgentTuneConfig, run_dir: Path | None, *, resume: bool = False) -> Path:
    """The run directory `prepare_run` uses: `run_dir`, else the latest run (resuming) or a new one."""
    return run_dir or (latest_run_dir(config) if resume else None) or default_run_dir(config)


def prepare_run(config: AgentTuneConfig, run_dir: Path | None, *, resume: bool = False) -> Run:
    """Create (or reopen, when resuming) the run directory and start logging into it."""
    run_dir = choose_run_dir(config, run_dir, resume=resume)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "rollouts").mkdir(exist_ok=True)
    except OSError as error:
        raise UserError(f"Cannot create the run directory {str(run_dir)!r}: {error}.",
                        hint="Pass a writable directory with --run-dir.") from error
    config_text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    (run_dir / "config.yaml").write_text(config_text, encoding="utf-8")
    configure_logging(run_dir / "log.jsonl")
    return Run(config=config, run_dir=run_dir, resume=resume)


def configure_logging(log_file: Path | None = None, *, level: int = logging.INFO) -> None:
    """Readable logs on the console, JSON lines in the run's log file."""
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger("agenttune")
    root.handlers.clear()
    root.setLevel(level)
    root.propagate = False
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(structlog.stdlib.ProcessorFormatter(
        processor=structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()), foreign_pre_chain=shared))
    root.addHandler(console)
    if log_file is not None:
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            processor=structlog.processors.JSONRenderer(), foreign_pre_chain=shared))
        root.addHandler(file_handler)


def get_logger(name: str = "agenttune") -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name if name.startswith("agenttune") else f"agenttune.{name}")
