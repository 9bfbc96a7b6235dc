"""Backbones consume rollouts: log them (debug), train locally, or hand them to a cluster trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from agenttune.config import AgentTuneConfig
    from agenttune.run import Run


class Backbone:
    """Runs a configured job.

    `name` is what `--backbone` selects. `check(config)` runs before any heavy work: it raises
    `UserError` when the backbone's requirements are missing (a package, a GPU, a config value).
    `native_config(config)` returns the engine's own configuration generated from agenttune's
    (printed by `agenttune config show --backbone NAME`), or None when there is none.
    `run(run)` does the job inside the prepared run directory.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @classmethod
    def check(cls, config: AgentTuneConfig) -> None:
        """Fail early, with a UserError, when this backbone cannot run this config here."""

    @classmethod
    def native_config(cls, config: AgentTuneConfig) -> dict[str, Any] | None:
        return None

    def run(self, run: Run) -> None:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement run(run)")
