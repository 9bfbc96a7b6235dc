"""Which extra of an installed agenttune plugin brings the package a failing import needed.

A plugin that supports several lines of a library (agenttune-plugin-agentscope: AgentScope 1.x with
the `agentscope1` extra, 2.x with `agentscope2`) cannot install both. When user code written for one
line is imported with the other installed, or with none, the ImportError alone does not say how to
fix it. This reads the installed plugins' metadata (their `agenttune` entry points and the extras
their requirements declare) and names the command that installs the wanted line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.metadata import (
    Distribution,
    PackageNotFoundError,
    entry_points,
    packages_distributions,
    version,
)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.requirements import Requirement

ENTRY_POINT_GROUP = "agenttune"


@dataclass(frozen=True)
class ExtraOffer:
    distribution: str  # the plugin, e.g. agenttune-plugin-agentscope
    extra: str  # e.g. agentscope1
    requirement: str  # what that extra asks for, e.g. agentscope<1.1,>=1.0
    install: str  # the pip command that installs the plugin with that extra


def import_hint(error: ImportError) -> str | None:
    """A sentence naming the installed version and the plugin extras that install others, or None."""
    package = (error.name or "").split(".")[0]
    if not package:
        return None
    offers = extras_for(package)
    if not offers:
        return None
    try:
        installed = f"{package} {version(_distribution_of(package))} is installed"
    except PackageNotFoundError:
        installed = f"{package} is not installed"
    choices = "; ".join(f"`{offer.install}` ({offer.requirement})" for offer in offers)
    return f"{installed}. Install the line this code was written for: {choices}."


def extras_for(package: str) -> list[ExtraOffer]:
    """The extras of installed agenttune plugins that require the distribution of `package`."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    wanted = canonicalize_name(_distribution_of(package))
    offers = []
    for plugin in _plugin_distributions():
        for line in plugin.requires or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            extra = _extra_of(requirement, plugin.metadata.get_all("Provides-Extra") or [])
            if extra and canonicalize_name(requirement.name) == wanted:
                offers.append(ExtraOffer(plugin.metadata["Name"], extra,
                                         f"{requirement.name}{requirement.specifier}", _install_command(plugin, extra)))
    return offers


def _distribution_of(package: str) -> str:
    """The distribution that installs the top-level `package` (itself when none is installed)."""
    return (packages_distributions().get(package) or [package])[0]


def _plugin_distributions() -> list[Distribution]:
    seen: dict[str, Distribution] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.dist is not None:
            seen.setdefault(entry.dist.metadata["Name"], entry.dist)
    return [seen[name] for name in sorted(seen)]


def _extra_of(requirement: Requirement, extras: list[str]) -> str | None:
    """The extra that alone brings `requirement` (`...; extra == "agentscope1"`), if any."""
    marker = requirement.marker
    if marker is None or marker.evaluate({"extra": ""}):
        return None
    return next((extra for extra in extras if marker.evaluate({"extra": extra})), None)


def _install_command(plugin: Distribution, extra: str) -> str:
    """`pip install -e 'PATH[extra]'` for an editable checkout, else `pip install 'NAME[extra]'`."""
    text = plugin.read_text("direct_url.json")
    if text:
        origin = json.loads(text)
        if origin.get("dir_info", {}).get("editable") and origin.get("url", "").startswith("file://"):
            return f"pip install -e '{origin['url'].removeprefix('file://')}[{extra}]'"
    return f"pip install '{plugin.metadata['Name']}[{extra}]'"


# The components agenttune's own plugins provide, by (kind, name): where an unknown name most likely comes from.
PLUGIN_COMPONENTS = {
    **{("judges", name): "agenttune-plugin-gsm8k" for name in ("math", "gsm8k", "math_and_llm")},
    ("judges", "env_service"): "agenttune-plugin-envservice", ("task_readers", "env_service"): "agenttune-plugin-envservice",
    ("judges", "reward_function"): "agenttune-plugin-aworld", ("agent_frameworks", "aworld"): "agenttune-plugin-aworld",
    ("agent_frameworks", "agentscope"): "agenttune-plugin-agentscope",
    ("backbones", "verl"): "agenttune-plugin-verl", ("engines", "verl"): "agenttune-plugin-verl",
    ("backbones", "trinity"): "agenttune-plugin-trinity", ("engines", "trinity"): "agenttune-plugin-trinity",
}


def component_hint(kind: str, name: str) -> str:
    """How to get the component `name` of `kind` that is not installed."""
    plugin = PLUGIN_COMPONENTS.get((kind, name))
    if plugin:
        return f"{name!r} comes from the {plugin} plugin: pip install {plugin}."
    return "Check the spelling, or install the plugin that provides it."
