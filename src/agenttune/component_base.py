"""What every configurable component shares: a `name` and an `Options` model.

The per-kind contracts (`readers/base.py`, `judges/base.py`, `engines/base.py`, ...) build on this
module; it imports nothing of agenttune, so every contract can sit below the code that uses it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class NoOptions(BaseModel):
    """For components that take no options: any key given is a mistake."""

    model_config = ConfigDict(extra="forbid")


class Component:
    """A component the config selects by `name`; `Options` validates the rest of its config section."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = NoOptions
