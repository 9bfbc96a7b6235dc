"""Load, merge and validate a configuration, turning every mistake into one clear paragraph."""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, create_model
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from agenttune.config import AgentTuneConfig, ComponentSection
from agenttune.errors import UserError
from agenttune.judge import NoOptions
from agenttune.plugins import get_plugin_manager


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise UserError(f"Config file {str(path)!r} does not exist.", hint="Check the path given to --conf.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"Cannot read config file {str(path)!r}: {error}.") from error
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        where = ""
        mark = getattr(error, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UserError(f"Config file {str(path)!r} is not valid YAML{where}: {problem}.",
                        hint="Fix the YAML syntax (indentation, colons, quotes).") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"Config file {str(path)!r} must hold a mapping of keys, not a {type(data).__name__}.")
    # ASTune configs wrap everything in one top-level key; accept that shape.
    for wrapper in ("agenttune", "astuner", "astune"):
        if set(data) == {wrapper} and isinstance(data[wrapper], dict):
            return data[wrapper]
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`rollout.num_repeat=8` -> (["rollout", "num_repeat"], 8); values are parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise UserError(f"Override {text!r} is not of the form key.path=value.",
                        hint="For example: rollout.num_repeat=8 or model.path=/models/qwen.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for override in overrides:
        path, value = parse_override(override)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return data


@cache
def config_model() -> type[AgentTuneConfig]:
    """AgentTuneConfig plus the sections plugins register."""
    sections = get_plugin_manager().config_sections()
    if not sections:
        return AgentTuneConfig
    fields = {name: (model, model()) for name, model in sections.items()}
    return create_model("AgentTuneConfig", __base__=AgentTuneConfig, **fields)  # type: ignore[call-overload]


class _DictSource(PydanticBaseSettingsSource):
    """A settings source that returns a fixed mapping (the YAML file's contents)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


def build_config(yaml_data: dict[str, Any], overrides: dict[str, Any], *, source: str = "config") -> AgentTuneConfig:
    """Validate with priority overrides > environment > YAML > defaults."""
    model = config_model()

    class Sourced(model):  # type: ignore[misc, valid-type]
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                       file_secret_settings):
            return (init_settings, env_settings, _DictSource(settings_cls, yaml_data))

    try:
        validated = Sourced(**overrides)
    except ValidationError as error:
        raise UserError(describe_validation_error(error, model, source)) from error
    return model.model_validate(validated.model_dump())


def load_config(conf: str | Path | None, overrides: list[str] = (), **fixed: Any) -> AgentTuneConfig:
    """The CLI's entry: a YAML file, `key.path=value` overrides, and fixed values from flags."""
    path = Path(conf) if conf else None
    yaml_data = read_yaml(path) if path else {}
    override_data = apply_overrides({}, list(overrides))
    for key, value in fixed.items():
        if value is not None:
            override_data[key] = value
    config = build_config(yaml_data, override_data, source=str(path) if path else "config")
    if path is not None:
        config._source_dir = path.resolve().parent  # where workflow modules next to the YAML are found
    return config


def describe_validation_error(error: ValidationError, model: type[BaseModel], source: str) -> str:
    problems = [_describe_one(item, model) for item in error.errors()]
    shown = "; ".join(problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return f"Invalid configuration in {source}: {shown}{more}."


def _describe_one(item: dict[str, Any], model: type[BaseModel]) -> str:
    location = [str(part) for part in item["loc"]]
    key = ".".join(location) or "(top level)"
    if item["type"] == "extra_forbidden":
        siblings = _field_names_at(model, location[:-1])
        guess = difflib.get_close_matches(location[-1], siblings, n=1)
        suggestion = f" — did you mean {'.'.join(location[:-1] + [guess[0]])!r}?" if guess else ""
        valid = f" Valid keys here: {', '.join(sorted(siblings))}." if siblings and not guess else ""
        return f"unknown key {key!r}{suggestion}{valid}"
    value = item.get("input")
    shown = repr(value) if not isinstance(value, dict) else "a mapping"
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{key} = {shown} is invalid: {item['msg'].rstrip('.')}"


def _field_names_at(model: type[BaseModel], location: list[str]) -> list[str]:
    current: Any = model
    for part in location:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = fields[part].annotation
    return list(getattr(current, "model_fields", {}) or [])


def component_options(component: type, section: ComponentSection, key: str) -> BaseModel:
    """Validate a component section's extra keys with the component's `Options` model."""
    options_model: type[BaseModel] = getattr(component, "Options", None) or NoOptions
    try:
        return options_model.model_validate(section.options())
    except ValidationError as error:
        problems = "; ".join(_describe_one(item, options_model) for item in error.errors()[:5])
        raise UserError(f"Invalid options for {key} (type {getattr(component, 'name', '?')!r}): {problems}.",
                        hint="See `agenttune plugins list` and the component's docs for its options.") from error
