"""Checkpoints: everything needed to continue a run as if it had never stopped.

    <run_dir>/checkpoints/step_000010/
        model/          Hugging Face format: the full model, or the LoRA adapter (+ the tokenizer)
        trainer.pt      optimizer and learning-rate scheduler state
        rng.pt          Python, torch (CPU and CUDA) random states
        state.json      step, data position, base model, whether `model/` is an adapter

A checkpoint is written under a temporary name and renamed when complete, so a run killed while
saving never leaves a half-written checkpoint that `--resume` would pick.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agenttune.errors import UserError

if TYPE_CHECKING:
    from agenttune.backbones.local.policy import Policy

PREFIX = "step_"


@dataclass
class CheckpointState:
    step: int
    task_order: dict[str, int]
    base_model: str  # the directory the run started from (LoRA adapters are applied to it)
    lora: bool
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_dir(checkpoints: Path, step: int) -> Path:
    return checkpoints / f"{PREFIX}{step:06d}"


def list_checkpoints(checkpoints: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not checkpoints.is_dir():
        return []
    found = [path for path in checkpoints.glob(f"{PREFIX}*") if (path / "state.json").exists()
             and path.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda path: int(path.name[len(PREFIX):]))


def latest_checkpoint(checkpoints: Path) -> Path | None:
    found = list_checkpoints(checkpoints)
    return found[-1] if found else None


def save_checkpoint(
    checkpoints: Path,
    state: CheckpointState,
    *,
    model: Policy,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    target = checkpoint_dir(checkpoints, state.step)
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(str(staging / "model"))
    if tokenizer is not None:
        tokenizer.save_pretrained(staging / "model")
    torch.save(trainer_state, staging / "trainer.pt")
    torch.save(capture_rng(), staging / "rng.pt")
    (staging / "state.json").write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    for old in list_checkpoints(checkpoints)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def read_state(path: Path) -> CheckpointState:
    try:
        return CheckpointState(**json.loads((path / "state.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as error:
        raise UserError(f"Checkpoint {str(path)!r} is unreadable: {error}.",
                        hint="Delete it to resume from the one before, or start a new run.") from error


def load_trainer_state(path: Path) -> dict[str, Any]:
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    return state


def restore_rng(path: Path) -> None:
    state = torch.load(path / "rng.pt", map_location="cpu", weights_only=False)
    random.setstate(state["python"])
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
