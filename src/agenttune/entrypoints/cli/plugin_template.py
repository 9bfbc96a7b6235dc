"""`agenttune plugins new`: a working plugin package, written from the templates in plugin_files/.

Each kind is one module of the new package, registered by its hook in `plugin.py`; `agent.py`,
`debug.yaml` and the tests use every kind chosen, so the package passes its own tests and runs a
debug episode as written (nox's `plugin_template` session installs one and checks both).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from agenttune.errors import UserError


@dataclass(frozen=True)
class Kind:
    hook: str  # the hook that registers it
    registry: str  # its kind in the registry (get_component)
    suffix: str  # its class name: <Camel><suffix>
    what: str  # what the README calls it


KINDS: dict[str, Kind] = {
    "reader": Kind("register_task_readers", "task_readers", "Reader", "a task reader"),
    "judge": Kind("register_judges", "judges", "Judge", "a judge"),
    "framework": Kind("register_agent_frameworks", "agent_frameworks", "Framework", "an agent framework"),
    "backbone": Kind("register_backbones", "backbones", "Backbone", "a backbone"),
    "engine": Kind("register_engines", "engines", "Engine", "an inference engine"),
    "parser": Kind("register_tool_parsers", "tool_parsers", "ToolParser", "a tool parser"),
}
TEMPLATES = files("agenttune.entrypoints.cli") / "plugin_files"  # the templates, package data
# Lowercase words joined by `-` or `_` (`countdown`, `my-env`, `my_env`): `-` stays in the distribution's
# name (agenttune-plugin-my-env) and becomes `_` wherever Python needs an identifier (agenttune_my_env), as
# cookiecutter-style templates do.
NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")


def write_plugin(name: str, kinds: list[str], directory: Path) -> list[Path]:
    """Write the package for plugin `name` with `kinds` into `directory` (which must not exist)."""
    import jinja2

    from agenttune.registry.compatibility import PLUGIN_API_VERSION

    check(name, kinds, directory)
    kinds = [kind for kind in KINDS if kind in kinds]  # one order, whatever the command line's
    name = identifier(name)
    camel = "".join(part.capitalize() for part in name.split("_"))
    major, minor = PLUGIN_API_VERSION
    package = f"agenttune_{name}"
    context = {
        "name": name, "package": package, "distribution": distribution(name),
        "camel": camel, "kinds": kinds, "kinds_text": listed([KINDS[kind].what for kind in kinds]),
        "classes": {kind: camel + KINDS[kind].suffix for kind in kinds},
        "hooks": {kind: KINDS[kind].hook for kind in kinds},
        "registry": {kind: KINDS[kind].registry for kind in kinds},
        "api_version": repr(PLUGIN_API_VERSION), "api_line": f"{major}.{minor}",
        "agenttune_pin": f">={major}.{minor},<{major}.{minor + 1}",
        "replies": json.dumps(['<call>answer {"value": "0"}</call>' if "parser" in kinds else "0"]),
        "expected_rewards": expected_rewards(kinds),
    }
    environment = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
    written = []
    for source, target in layout(package, kinds):
        text = environment.from_string(TEMPLATES.joinpath(*source.split("/")).read_text(encoding="utf-8"))
        path = directory / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.render(context), encoding="utf-8")
        written.append(path)
    return written


def check(name: str, kinds: list[str], directory: Path) -> None:
    if not NAME.fullmatch(name):
        raise UserError(f"{name!r} cannot name a plugin: it becomes the distribution agenttune-plugin-<name>, the "
                        "Python package agenttune_<name> and the components' names.",
                        hint="Use lowercase words of letters and digits joined by '-' or '_', starting with a letter "
                             "(e.g. 'countdown', 'my-env' or 'my_env').")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise UserError(f"Unknown plugin kind(s): {', '.join(unknown)}." if unknown else "No kind was chosen.",
                        hint=f"Choose among: {', '.join(KINDS)} (--kind reader --kind judge ...).")
    if directory.exists():
        raise UserError(f"{directory} already exists; `agenttune plugins new` writes a new folder.",
                        hint="Pick another --directory, or move that folder away.")


def identifier(name: str) -> str:
    """The plugin's name where Python needs an identifier: its package, entry point and components."""
    return name.replace("-", "_")


def distribution(name: str) -> str:
    return f"agenttune-plugin-{name.replace('_', '-')}"


def layout(package: str, kinds: list[str]) -> list[tuple[str, str]]:
    """(template, path in the new package) for every file the plugin gets."""
    files_ = [("pyproject.toml.jinja", "pyproject.toml"), ("README.md.jinja", "README.md"),
              ("debug.yaml.jinja", "debug.yaml"), ("tests/test_plugin.py.jinja", f"tests/test_{package}.py")]
    modules = ["__init__", "plugin", "agent", *kinds]
    return files_ + [(f"src/{module}.py.jinja", f"src/{package}/{module}.py") for module in modules]


def listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def expected_rewards(kinds: list[str]) -> str:
    """What the generated debug run must score: the plugin's engine answers right; the scripted
    engine says "0" to both tasks, right for the first only."""
    ids = ["train-0", "train-1"] if "reader" in kinds else ["say-0", "say-1"]
    second = 1.0 if "engine" in kinds else 0.0
    return repr({ids[0]: 1.0, ids[1]: second})
