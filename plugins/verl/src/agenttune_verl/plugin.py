"""Registers the `verl` backbone. Imports nothing heavy: verl is imported when the backbone runs."""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_backbones():
    from agenttune_verl.backbone import VerlBackbone

    return [VerlBackbone]
