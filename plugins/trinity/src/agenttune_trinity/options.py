"""The `trinity:` section: the trinity backbone's options (see Backbone.Options)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, RootModel

if TYPE_CHECKING:
    from agenttune.plugin_api import AgentTuneConfig


class TrinityOptions(RootModel[dict[str, Any]]):
    """Trinity-RFT's own config keys, merged over the config agenttune generates."""

    root: dict[str, Any] = Field(default_factory=dict)


def tinker_mode(config: AgentTuneConfig) -> dict[str, Any] | None:
    """The `trinity.model.tinker` section when Trinity's Tinker mode is on (the CPU path), else None."""
    model = config.section("trinity", TrinityOptions).root.get("model") or {}
    tinker = model.get("tinker") or {}
    return tinker if tinker.get("enable") else None
