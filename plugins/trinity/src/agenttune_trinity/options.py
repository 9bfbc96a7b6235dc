"""The `trinity:` section: the trinity backbone's options (see Backbone.Options)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, RootModel


class TrinityOptions(RootModel[dict[str, Any]]):
    """Trinity-RFT's own config keys, merged over the config agenttune generates."""

    root: dict[str, Any] = Field(default_factory=dict)
