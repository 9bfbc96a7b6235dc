"""What the viewer serves: the runs and step files under its root, and nothing outside it.

The root is a project directory of runs (`runs/`), one run directory, a run's `rollouts/` directory,
or a single rollout file. Clients name runs and files by their path relative to the root; every
name is resolved (symlinks included) and refused unless it lands inside the root, and a file read
whole (`read_regular_file`) must be a regular file under a size cap: a `metrics.jsonl` linked to
/dev/zero or to a file elsewhere is refused, not read.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP_FILE = re.compile(r"^step_(\d+)_(.+)\.jsonl$")
ROLLOUTS = "rollouts"
METRICS = "metrics.jsonl"
MAX_DEPTH = 6  # how deep below the root runs are looked for
MAX_DIRECTORIES = 20_000  # a root like `~` must not make every refresh walk the whole disk
SKIPPED = {"checkpoints", "__pycache__", "node_modules", "site-packages"}
MAX_METRICS_BYTES = 256 * 2**20  # metrics.jsonl of a long run is a few MB; the viewer reads it whole


def choose_root(path: Path | None) -> Path:
    """What `agenttune logview [PATH]` serves: PATH, else `./runs` when it exists, else `.`."""
    from agenttune.errors import UserError

    if path is None:
        path = Path("runs") if Path("runs").is_dir() else Path(".")
    if not path.exists():
        raise UserError(f"{str(path)!r} does not exist.",
                        hint="Pass a run directory, a directory of runs (like ./runs), or a rollout file "
                             "(<run_dir>/rollouts/step_000001_train.jsonl).")
    if path.is_file() and path.suffix != ".jsonl":
        raise UserError(f"{str(path)!r} is not a rollout file (those end in .jsonl).",
                        hint="Pass a run directory, a directory of runs, or a rollout .jsonl file.")
    return path.resolve()


class PathRefused(Exception):
    """A client named a path outside the root, or something that is not a rollout file."""


class NotFound(Exception):
    pass


class TooLarge(Exception):
    pass


@dataclass(frozen=True)
class StepFile:
    id: str  # path relative to the root
    name: str
    step: int | None
    split: str | None
    size: int
    mtime: float

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "step": self.step, "split": self.split,
                "size": self.size, "mtime": self.mtime}


@dataclass(frozen=True)
class RunEntry:
    id: str  # path relative to the root ("." for the root itself)
    name: str
    steps: tuple[StepFile, ...]
    has_metrics: bool

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "has_metrics": self.has_metrics,
                "steps": [step.as_json() for step in self.steps]}


class Catalog:
    def __init__(self, root: Path):
        # The root may not exist yet: `train --with-logview` starts the viewer before the run begins.
        self.root = Path(root).expanduser().resolve()

    @property
    def is_file(self) -> bool:
        return self.root.is_file()

    def runs(self) -> list[RunEntry]:
        if self.is_file:
            return [RunEntry(".", self.root.name, (self._step_file(self.root),), False)]
        if not self.root.is_dir():
            return []
        return [self._run(directory) for directory in self._run_directories()]

    def rollout_file(self, file_id: str) -> Path:
        """The rollout file named `file_id`, checked to be inside the root."""
        path = self._inside(file_id)
        if self.is_file:
            if path != self.root:
                raise PathRefused(f"{file_id!r} is not the file this viewer serves.")
            return path
        if not STEP_FILE.match(path.name):
            raise PathRefused(f"{file_id!r} is not a rollout file (step_NNNNNN_SPLIT.jsonl).")
        if not _answers(path.is_file):
            raise NotFound(f"No rollout file {file_id!r}.")
        return path

    def metrics_file(self, run_id: str) -> Path:
        """`metrics.jsonl` of the run named `run_id` (which may not have one yet)."""
        if self.is_file:
            raise NotFound("A single rollout file has no metrics.")
        run = self._inside(run_id)
        if not _answers(run.is_dir):
            raise NotFound(f"No run {run_id!r}.")
        path = (run / METRICS).resolve()  # the file itself may be a link
        if not path.is_relative_to(self.root):
            raise PathRefused(f"{run_id!r}/{METRICS} links outside the directory this viewer serves.")
        return path

    def _inside(self, relative: str) -> Path:
        if not relative or "\x00" in relative:
            raise PathRefused("An empty or malformed path.")
        base = self.root.parent if self.is_file else self.root
        path = (base / relative).resolve()
        allowed = path == self.root if self.is_file else path.is_relative_to(self.root)
        if not allowed:
            raise PathRefused(f"{relative!r} is outside the directory this viewer serves.")
        return path

    def _run_directories(self) -> list[Path]:
        """Directories holding `rollouts/` or `metrics.jsonl` (and the root, when it holds step files)."""
        found: list[Path] = []
        visited = 0
        for directory, subdirectories, files in os.walk(self.root):
            here = Path(directory)
            visited += 1
            depth = len(here.relative_to(self.root).parts)
            is_run = ROLLOUTS in subdirectories or METRICS in files
            holds_steps = here == self.root and any(STEP_FILE.match(name) for name in files)
            if is_run or holds_steps:
                found.append(here)
            if is_run or depth >= MAX_DEPTH or visited >= MAX_DIRECTORIES:
                subdirectories.clear()  # runs do not nest
            else:
                subdirectories[:] = sorted(name for name in subdirectories
                                           if not name.startswith(".") and name not in SKIPPED)
        return sorted(found)

    def _run(self, directory: Path) -> RunEntry:
        relative = directory.relative_to(self.root).as_posix()
        rollouts = directory / ROLLOUTS if (directory / ROLLOUTS).is_dir() else directory
        steps = [self._step_file(path) for path in sorted(rollouts.glob("step_*.jsonl"))
                 if STEP_FILE.match(path.name) and path.is_file() and path.resolve().is_relative_to(self.root)]
        steps.sort(key=lambda step: (step.step if step.step is not None else -1, step.split or ""))
        name = self.root.name if relative == "." else relative
        return RunEntry(relative, name, tuple(steps), (directory / METRICS).is_file())

    def _step_file(self, path: Path) -> StepFile:
        match = STEP_FILE.match(path.name)
        stat = path.stat()
        relative = path.name if self.is_file else path.relative_to(self.root).as_posix()
        return StepFile(relative, path.name, int(match[1]) if match else None, match[2] if match else None,
                        stat.st_size, stat.st_mtime)


def read_regular_file(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` (None when it does not exist), refused unless it is a regular file of at most
    `limit` bytes. Checked on the open file (no race with a swap), opened without following a link or
    waiting on a FIFO."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise PathRefused(f"{path.name} cannot be read: {error.strerror}.") from None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise PathRefused(f"{path.name} is not a regular file.")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{path.name} is larger than {limit // 2**20} MiB, more than the viewer reads.")
    return data


def _answers(check: Callable[[], bool]) -> bool:
    """`path.is_file()` / `is_dir()`, False where the file system refuses the question (a name too long)."""
    try:
        return check()
    except OSError:
        return False
