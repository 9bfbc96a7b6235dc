"""Registers the `verl` backbone (its options are the `verl:` section) and the `ray:` section. Imports nothing heavy: verl is imported when the backbone runs."""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_backbones():
    from agenttune_verl.backbone import VerlBackbone

    return [VerlBackbone]


@hookimpl
def register_config_sections():
    from agenttune_verl.options import RayOptions

    return {"ray": RayOptions}
