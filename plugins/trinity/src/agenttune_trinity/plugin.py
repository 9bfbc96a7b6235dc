"""Registers the `trinity` backbone. Imports nothing heavy: Trinity-RFT is imported when it runs."""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_backbones():
    from agenttune_trinity.backbone import TrinityBackbone

    return [TrinityBackbone]
