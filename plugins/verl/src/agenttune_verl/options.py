"""The config sections the verl plugin owns: `verl:` (the backbone's options) and `ray:`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel


class VerlOptions(RootModel[dict[str, Any]]):
    """verl's own config keys (nested, or dotted like `trainer.balance_batch`), applied verbatim last."""

    root: dict[str, Any] = Field(default_factory=dict)


class RayOptions(BaseModel):
    """The Ray cluster the verl backbone runs on."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    address: str | None = Field(
        default=None,
        description="Ray cluster to join (e.g. 'ray://head:10001' or 'auto'); none: start a local Ray head on this "
        "machine.",
    )
