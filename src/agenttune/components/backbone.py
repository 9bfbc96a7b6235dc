"""Backbones consume rollouts: log them (debug), train locally, or hand them to a cluster trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from agenttune.config.base import Component
from agenttune.errors import UserError

if TYPE_CHECKING:
    from agenttune.config.models import AgentTuneConfig
    from agenttune.config.run import Run


class Backbone(Component):
    """Runs a configured job.

    `name` is what `--backbone` selects. `Options` is the backbone's own top-level config section,
    named after it (`local:`, `debug:`, `verl:`): the section exists when the backbone is installed
    and is read back with `config.section(name, Options)`; the default `NoOptions` adds none.
    `check(config)` runs before any heavy work: it raises
    `UserError` when the backbone's requirements are missing (a package, a GPU, a config value).
    `native_config(config)` returns the engine's own configuration generated from agenttune's
    (printed by `agenttune config show --backbone NAME`), or None when there is none.
    `run(run)` does the job inside the prepared run directory.
    """

    description: ClassVar[str] = ""

    @classmethod
    def check(cls, config: AgentTuneConfig) -> None:
        """Fail early, with a UserError, when this backbone cannot run this config here."""

    @classmethod
    def native_config(cls, config: AgentTuneConfig) -> dict[str, Any] | None:
        return None

    def run(self, run: Run) -> None:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement run(run)")


def missing_validation_split(config: AgentTuneConfig) -> UserError | None:
    """The error for a trainer that asks for validation when there is no validation split, else None.

    Backbones that hand validation to another trainer (verl, Trinity-RFT) report it in `check()`,
    before any work, rather than leave that trainer to validate on nothing.
    """
    wants_validation = config.trainer.test_freq > 0 or config.trainer.val_before_train
    if not wants_validation or config.task_reader.validation_split is not None:
        return None
    return UserError("trainer.test_freq / trainer.val_before_train ask for validation, but task_reader.validation_split "
                     "is not set.", hint="Set task_reader.validation_split, or set trainer.test_freq=0 and "
                                         "trainer.val_before_train=false.")

