"""What every configurable component shares: a `name` and an `Options` model.

The per-kind contracts (`components/readers/base.py`, `components/judges/base.py`, `components/engines/base.py`, ...) build on this
module; it imports nothing of agenttune, so every contract can sit below the code that uses it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class NoOptions(BaseModel):
    """For components that take no options: any key given is a mistake."""

    model_config = ConfigDict(extra="forbid")


class Section(BaseModel):
    """A config section: a key it does not declare is a mistake, and assignments are validated.

    Here rather than in models.py so that declaring a component's options (the backbones' sections)
    does not import pydantic-settings: `agenttune --help` imports the built-in backbones.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Component:
    """A component the config selects by `name`; `Options` validates the rest of its config section."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = NoOptions
