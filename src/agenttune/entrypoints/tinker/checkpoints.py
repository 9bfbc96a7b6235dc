"""`tinker://` paths as directories under the server's state directory, so they outlive the server.

    tinker://<model_id>/weights/<name>           <state_dir>/<model_id>/weights/<name>/
    tinker://<model_id>/sampler_weights/<name>   <state_dir>/<model_id>/sampler_weights/<name>/

A directory holds the LoRA adapter as peft saves it (adapter_config.json, adapter_model.safetensors),
`checkpoint.json` (the base model and LoRA settings, what `weights_info` answers) and, for `weights`,
the optimizer's state (`optimizer.pt`). Names come from clients, so they are checked before they
become paths: one path segment of letters, digits and `._-:`.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from agenttune.entrypoints.tinker.futures import TinkerError

SCHEME = "tinker://"
Kind = Literal["weights", "sampler_weights"]
KINDS: tuple[Kind, ...] = ("weights", "sampler_weights")
SEGMENT = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
METADATA = "checkpoint.json"


@dataclass(frozen=True)
class Checkpoint:
    model_id: str
    kind: Kind
    name: str
    directory: Path

    @property
    def path(self) -> str:
        return f"{SCHEME}{self.model_id}/{self.kind}/{self.name}"

    def metadata(self) -> dict[str, Any]:
        return json.loads((self.directory / METADATA).read_text())

    def listing(self) -> dict[str, Any]:
        """What the SDK's `types.Checkpoint` holds (`list_checkpoints`, `TrainingRun.last_checkpoint`)."""
        saved = self.directory / METADATA
        return {"checkpoint_id": f"{self.kind}/{self.name}", "tinker_path": self.path,
                "checkpoint_type": "training" if self.kind == "weights" else "sampler",
                "time": iso_time(saved.stat().st_mtime), "public": False,
                "size_bytes": sum(path.stat().st_size for path in self.directory.iterdir() if path.is_file())}


class CheckpointStore:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def new(self, model_id: str, kind: Kind, name: str, *, overwrite: bool = True) -> Checkpoint:
        """An empty directory for a checkpoint about to be written (a previous one of that name is
        replaced when `overwrite`)."""
        checkpoint = self._checkpoint(model_id, kind, name)
        if checkpoint.directory.exists():
            if not overwrite:
                raise TinkerError(f"A checkpoint {checkpoint.path} exists; pass overwrite=True to replace it.", 409)
            shutil.rmtree(checkpoint.directory)
        checkpoint.directory.mkdir(parents=True)
        return checkpoint

    def write_metadata(self, checkpoint: Checkpoint, metadata: dict[str, Any]) -> None:
        # Written last: a directory without it is a save that did not finish, and is not found.
        (checkpoint.directory / METADATA).write_text(json.dumps(metadata, indent=1))

    def prune(self, model_id: str, kind: Kind, prefix: str, keep: int) -> None:
        """Delete all but the newest `keep` checkpoints of `model_id` whose names start with `prefix`."""
        directory = self._checkpoint(model_id, kind, prefix + "x").directory.parent
        found = sorted((path for path in directory.glob(prefix + "*") if path.is_dir()),
                       key=lambda path: path.stat().st_mtime_ns)
        for path in found[:-keep] if keep > 0 else found:
            shutil.rmtree(path, ignore_errors=True)

    def find(self, path: str) -> Checkpoint:
        """The saved checkpoint `path` names; a TinkerError when the path is malformed or nothing is there."""
        if not path.startswith(SCHEME):
            raise TinkerError(f"{path!r} is not a tinker:// path (tinker://<model_id>/weights/<name>).")
        parts = path[len(SCHEME):].split("/")
        if len(parts) != 3 or parts[1] not in KINDS:
            raise TinkerError(f"{path!r} is not a checkpoint path: expected tinker://<model_id>/weights/<name> "
                              "or tinker://<model_id>/sampler_weights/<name>.")
        checkpoint = self._checkpoint(parts[0], parts[1], parts[2])
        if not (checkpoint.directory / METADATA).is_file():
            raise TinkerError(f"No checkpoint is saved at {path}.", 404)
        return checkpoint

    def saved(self, model_id: str | None = None) -> list[Checkpoint]:
        """Every finished checkpoint (of `model_id`, or of every model), newest first."""
        if model_id is not None:
            self._checkpoint(model_id, "weights", "any")  # a client's id, checked before it reaches glob
        found = [Checkpoint(directory.parent.parent.name, directory.parent.name, directory.name, directory)  # type: ignore[arg-type]
                 for kind in KINDS for directory in self.root.glob(f"{model_id or '*'}/{kind}/*")
                 if (directory / METADATA).is_file()]
        return sorted(found, key=lambda checkpoint: (checkpoint.directory / METADATA).stat().st_mtime_ns,
                      reverse=True)

    def delete(self, model_id: str, checkpoint_id: str) -> Checkpoint:
        """Delete `<kind>/<name>` of `model_id` (the SDK's `delete_checkpoint`). A bare `<name>`, as
        Trinity-RFT sends for a stale sampler checkpoint, names the one checkpoint of either kind that has it."""
        named, _, name = checkpoint_id.rpartition("/")
        if named and named not in KINDS:
            raise TinkerError(f"{checkpoint_id!r} is not a checkpoint id: expected weights/<name> or "
                              "sampler_weights/<name>.")
        kinds = [kind for kind in KINDS if kind == named or not named and
                 (self._checkpoint(model_id, kind, name).directory / METADATA).is_file()]
        if len(kinds) > 1:
            raise TinkerError(f"Both weights/{name} and sampler_weights/{name} exist for {model_id}: name the one "
                              "to delete with its kind.")
        if not kinds:
            raise TinkerError(f"No checkpoint {checkpoint_id!r} is saved for {model_id}.", 404)
        checkpoint = self.find(self._checkpoint(model_id, kinds[0], name).path)
        shutil.rmtree(checkpoint.directory)
        return checkpoint

    def _checkpoint(self, model_id: str, kind: Kind, name: str) -> Checkpoint:
        for segment in (model_id, name):
            if not SEGMENT.fullmatch(segment) or segment in (".", ".."):
                raise TinkerError(f"{segment!r} cannot name a checkpoint: use letters, digits and ._-: only.")
        return Checkpoint(model_id, kind, name, self.root / model_id / kind / name)


def iso_time(timestamp: float) -> str:
    """A file time as the SDK's datetimes read it."""
    return datetime.fromtimestamp(timestamp, tz=UTC).isoformat()
