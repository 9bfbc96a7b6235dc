"""Load, merge and validate a configuration, turning every mistake into one clear paragraph."""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from agenttune.config.base import NoOptions
from agenttune.config.install_hints import PLUGIN_COMPONENTS
from agenttune.config.models import AgentTuneConfig, ComponentSection, with_sections, yaml_values
from agenttune.errors import UserError
from agenttune.registry.manager import get_plugin_manager


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise UserError(f"Config file {str(path)!r} does not exist.", hint="Check the path given to --conf.")
    if path.is_dir():
        raise UserError(f"Config file {str(path)!r} is a directory.", hint="Pass the YAML file itself to --conf.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"Config file {str(path)!r} is not UTF-8 text ({error.reason} at byte {error.start}).",
                        hint="Save it as UTF-8.") from error
    except OSError as error:
        raise UserError(f"Cannot read config file {str(path)!r}: {error.strerror or error}.",
                        hint="Check the file's permissions.") from error
    if not _YAML_CONTENT.search(text):
        raise UserError(f"Config file {str(path)!r} is empty{' (comments only)' if text.strip() else ''}.",
                        hint="Write the run's keys into it (`workflow:`, `task_reader:`, `model:` ...); "
                             "`agenttune config docs` lists them all.")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        message, hint = _yaml_problem(str(path), error, text)
        raise UserError(message, hint=hint) from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"Config file {str(path)!r} must hold a mapping of keys, not a {type(data).__name__}.",
                        hint="Start it with top-level keys such as `workflow:` and `task_reader:`.")
    return unwrapped(joined_surrogates(data, str(path)))


_YAML_CONTENT = re.compile(r"^[ \t]*[^\s#]", re.MULTILINE)  # a line that is not blank or a comment


def _yaml_problem(path: str, error: yaml.YAMLError, text: str) -> tuple[str, str]:
    """(message, hint) for a YAML error, at the line where the problem starts.

    An unclosed quote or bracket is found where the file ends (`context_mark` is where it opened), or,
    when a later quote closes it, where the swallowed lines stop making sense: then the first line
    with an unbalanced double quote before that is named.
    """
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None) or ""
    mark, opened = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
    tag = re.search(r"tag '(![^']*)'", problem)
    if tag:
        line = f" at line {mark.line + 1}" if mark is not None else ""
        return (f"Config file {path!r} uses the YAML tag {tag.group(1)}{line}, which agenttune does not support "
                "(it reads plain YAML: no !include, !env or Python tags).",
                "Paste the included content in place, or set the value with a key.path=value override; "
                "values from the environment go in AGENTTUNE_<SECTION>__<KEY> variables.")
    if opened is not None and mark is not None and opened.line != mark.line and context.startswith("while scanning"):
        what = context.removeprefix("while scanning ").strip()
        return (f"Config file {path!r} is not valid YAML: the {what} opened at line {opened.line + 1}, column "
                f"{opened.column + 1} is not closed (the parser ran on to line {mark.line + 1}: {problem}).",
                f"Close it on line {opened.line + 1}: a quote needs its closing quote, a [ or {{ its ] or }}.")
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    unbalanced = _unbalanced_quote_line(text, mark.line) if mark is not None else None
    if unbalanced is not None and mark is not None:
        return (f"Config file {path!r} is not valid YAML{where}: {problem}; the double quote opened at line "
                f"{unbalanced} is not closed on its line, so everything up to line {mark.line + 1} was read as one "
                "string.", f"Close the quote on line {unbalanced}.")
    return (f"Config file {path!r} is not valid YAML{where}: {problem}.",
            "Fix the YAML syntax (indentation, colons, quotes).")


def _unbalanced_quote_line(text: str, before: int) -> int | None:
    """The first line (1-based) before line index `before` with an odd number of unescaped double quotes
    outside a comment, if any."""
    for number, line in enumerate(text.splitlines()[:before], start=1):
        if line.lstrip().startswith("#"):
            continue
        if len(re.findall(r'(?<!\\)"', line)) % 2:
            return number
    return None


def joined_surrogates(value: Any, source: str, key: str = "") -> Any:
    """Strings with UTF-16 surrogate escapes ("\\ud83d\\udd0d", as JSON writers emit emoji) made whole.

    YAML reads each escape as its own character, so a pair arrives as two lone surrogates that no
    encoder accepts (they would fail much later, deep in a tokenizer). Pairs are joined; a lone
    surrogate is an error naming the key.
    """
    if isinstance(value, dict):
        return {k: joined_surrogates(v, source, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [joined_surrogates(v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str) or not _SURROGATE.search(value):
        return value
    try:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        raise UserError(f"{source}: the string at {key or 'the top level'} holds a lone UTF-16 surrogate (an "
                        "unpaired \\ud800-\\udfff escape), which is not text.",
                        hint="Write the character itself, or escape it as a complete pair (or as \\UXXXXXXXX).") from None


_SURROGATE = re.compile("[\ud800-\udfff]")


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.safe_load`, except that a key given twice in one mapping is an error: YAML itself keeps
    the last one and silently drops the first (a whole section, when a section is repeated)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):  # construct_mapping explains unhashable keys itself
            continue
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} appears more than once in the same mapping", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def unwrapped(data: dict[str, Any]) -> dict[str, Any]:
    """ASTune configs wrap everything in one top-level key; accept that shape."""
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
    return key.strip().split("."), joined_surrogates(value, f"override {text!r}", key.strip())


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


def config_model() -> type[AgentTuneConfig]:
    """AgentTuneConfig plus the sections the registered plugins add."""
    sections = get_plugin_manager().config_sections()
    return with_sections(tuple(sorted(sections.items(), key=lambda item: item[0])))


def build_config(yaml_data: dict[str, Any], overrides: dict[str, Any], *, source: str = "") -> AgentTuneConfig:
    """Validate once, with priority overrides > environment > YAML > defaults (the sources are
    composed in AgentTuneConfig.settings_customise_sources)."""
    model = config_model()
    check_environment(model)
    token = yaml_values.set(yaml_data)
    try:
        return model(**overrides)
    except ValidationError as error:
        raise UserError(describe_validation_error(error, model, source, overrides)) from error
    finally:
        yaml_values.reset(token)


# `AGENTTUNE_…` variables that are not configuration keys: read by the CLI, plugin loading, the
# tiny-model cache, the browser tests, the llm_judge's defaults and the EnvService plugin.
OTHER_VARIABLES = frozenset({
    "AGENTTUNE_LOAD_PLUGINS", "AGENTTUNE_DISABLE_PLUGINS", "AGENTTUNE_TRACE_PLUGINS", "AGENTTUNE_CACHE_DIR",
    "AGENTTUNE_CHROMIUM", "AGENTTUNE_JUDGE_MODEL", "AGENTTUNE_JUDGE_BASE_URL", "AGENTTUNE_JUDGE_API_KEY",
    "AGENTTUNE_ENV_SERVICE_URL",
})


def check_environment(model: type[BaseModel]) -> None:
    """Every `AGENTTUNE_…` variable must name a config key (`AGENTTUNE_ROLLOUT__NUM_REPEAT`) or be one of
    OTHER_VARIABLES. pydantic-settings silently skips the others, so a typo (one underscore, a misspelt
    section) would leave the file's value in force."""
    known = set(OTHER_VARIABLES)
    for name, field in model.model_fields.items():
        known.add(f"AGENTTUNE_{name.upper()}")
        for inner in getattr(field.annotation, "model_fields", None) or ():
            known.add(f"AGENTTUNE_{name.upper()}__{inner.upper()}")
    sections = {name.upper() for name in model.model_fields}
    for variable in sorted(os.environ):
        if not variable.upper().startswith("AGENTTUNE_") or variable.upper() in known:
            continue
        head = variable.upper()[len("AGENTTUNE_"):].split("__", 1)[0]
        if "__" in variable and head in sections:
            continue  # deeper keys are checked like the file's: unknown ones are reported with a guess
        guess = difflib.get_close_matches(variable.upper(), sorted(known), n=1, cutoff=0.75)
        raise UserError(f"The environment variable {variable} is not a configuration key, so it would be ignored"
                        f"{f'; did you mean {guess[0]}?' if guess else '.'}",
                        hint="Config keys are AGENTTUNE_<SECTION>__<KEY> (two underscores between section and key), "
                             f"e.g. AGENTTUNE_ROLLOUT__NUM_REPEAT=8; unset {variable} if it is not meant for agenttune.")


def load_config(conf: str | os.PathLike[str] | Mapping[str, Any] | AgentTuneConfig | None,
                overrides: Sequence[str] = (),
                **fixed: Any) -> AgentTuneConfig:
    """The CLI's entry (and agenttune.Trainer's): a config, `key.path=value` overrides, and fixed values
    from flags. The config is a YAML file, or, from Python, its contents as a dict (read like the file)
    or an AgentTuneConfig (whose values then rank above the environment, as when it was made)."""
    source, source_dir, yaml_data, override_data = "", None, {}, {}
    if isinstance(conf, AgentTuneConfig):
        override_data, source_dir = conf.model_dump(), conf.source_dir
    elif isinstance(conf, Mapping):
        yaml_data, source = unwrapped(copy.deepcopy(dict(conf))), "the config dict"
    elif conf:
        path = Path(conf)
        yaml_data, source = read_yaml(path), str(path)
        source_dir = path.resolve().parent  # where workflow modules next to the YAML are found
    apply_overrides(override_data, list(overrides))
    for key, value in fixed.items():
        if value is not None:
            override_data[key] = value
    config = build_config(yaml_data, override_data, source=source)
    config._source_dir = source_dir
    return config


def describe_validation_error(error: ValidationError, model: type[BaseModel], source: str,
                              overrides: dict[str, Any] | None = None) -> str:
    problems = [_describe_one(item, model) + _origin(item["loc"], overrides or {}) for item in error.errors()]
    shown = "; ".join(problems[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return f"Invalid configuration{f' in {source}' if source else ''}: {shown}{more}"


def _origin(location: tuple[Any, ...], overrides: dict[str, Any]) -> str:
    """Where a bad value came from, when not from the YAML file: the command line or the environment."""
    node: Any = overrides
    for part in location:
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return " (from the command line)"
    for depth in range(len(location), 0, -1):
        variable = "AGENTTUNE_" + "__".join(str(part) for part in location[:depth]).upper()
        if variable in os.environ:
            return f" (from the environment variable {variable})"
    return ""


def _describe_one(item: ErrorDetails, model: type[BaseModel], prefix: str = "") -> str:
    """One validation problem, naming the key path (`prefix` is where `model` sits in the config)."""
    location = [str(part) for part in item["loc"]]
    path = [prefix, *location] if prefix else location
    key = ".".join(path) or "(top level)"
    if item["type"] == "extra_forbidden":
        siblings = _field_names_at(model, location[:-1])
        guess = difflib.get_close_matches(location[-1], siblings, n=1)
        if guess:
            return f"unknown key {key!r}; did you mean {'.'.join([*path[:-1], guess[0]])!r}?"
        valid = f" (valid keys here: {', '.join(sorted(siblings))})" if siblings else ""
        if len(path) == 1:  # a top-level section: a component that is not installed may own it
            return (f"unknown key {key!r}{valid}; if it is the section of a component from a plugin, install "
                    "that plugin (agenttune-plugin-verl owns `verl:` and `ray:`, for example): `agenttune plugins "
                    "list` shows the sections each installed plugin owns")
        return f"unknown key {key!r}{valid}"
    if item["type"] == "missing":
        return f"{key} is required"
    value = item.get("input")
    if isinstance(value, str) and _is_component_section(model, location):
        kind = _COMPONENT_KINDS.get(location[-1], "")
        plugin = PLUGIN_COMPONENTS.get((kind, value))
        origin = f" (the {value!r} {location[-1].replace('_', ' ')} comes from the {plugin} plugin)" if plugin else ""
        return (f"{key} = {value!r} is invalid: {key} is a section that names its component by `type`; write "
                f"`{key}: {{type: {value}}}`{origin}")
    shown = repr(value) if not isinstance(value, dict) else "a mapping"
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{key} = {shown} is invalid: {item['msg'].rstrip('.')}"


_COMPONENT_KINDS = {"judge": "judges", "task_reader": "task_readers", "engine": "engines"}


def _is_component_section(model: type[BaseModel], location: list[str]) -> bool:
    fields = getattr(model, "model_fields", {})
    if len(location) != 1 or location[0] not in fields:
        return False
    annotation = fields[location[0]].annotation
    return isinstance(annotation, type) and issubclass(annotation, ComponentSection)


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
        problems = "; ".join(_describe_one(item, options_model, prefix=key) for item in error.errors()[:5])
        name = getattr(component, "name", "?")
        raise UserError(f"Invalid options for {key} (type {name!r}): {problems}",
                        hint=f"See the {name!r} options in `agenttune config docs` or the component's docs.") from error
