"""No option silently dropped: walk every agenttune config key through a backbone's translation.

A backbone that generates another trainer's config (verl, Trinity-RFT) must carry every setting over or
refuse it. `KeyWalk` sets each leaf key of the config model alone to a non-default value and asks the
backbone's translation: the generated config changes (the value reached it), a `UserError` names the key
(refused), or it stays the same, which is allowed only for keys listed with the reason they do not concern
that backbone. A plugin's test builds one `KeyWalk` and parametrizes over `walk.cases()`:

    WALK = KeyWalk("verl", BASE, translate, values=VALUES, context=CONTEXT, not_for=NOT_FOR_VERL)

    @pytest.mark.parametrize(("key", "value"), WALK.cases(), ids=WALK.case_id)
    def test_every_key_reaches_verl_or_is_refused(key, value):
        WALK.check(key, value)
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, RootModel

from agenttune.errors import UserError
from agenttune.registry.config_loading import build_config, config_model

# The built-in backbones' own sections: options of trainers a plugin backbone's run never starts.
OTHER_BACKBONES = ("local", "debug")


def _unwrap(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def leaf_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, annotation) of every leaf of the config model; root-model sections are leaves."""
    keys = []
    for name, info in model.model_fields.items():
        annotation = _unwrap(info.annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and not issubclass(annotation,
                                                                                                  RootModel):
            keys += leaf_keys(annotation, f"{prefix}{name}.")
        else:
            keys.append((f"{prefix}{name}", info.annotation))
    return keys


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = copy.deepcopy(value)


def build(data: Mapping[str, Any]) -> Any:
    return build_config(copy.deepcopy(dict(data)), {})


@dataclass
class KeyWalk:
    """Every config key through `translate` (a config -> the generated native config, raising UserError
    for what the backbone refuses). `values`: keys whose type gives no non-default value (strings, lists),
    or several values that mean different things; `context`: what a key needs set around it to mean
    anything (a threshold needs its criterion); `same_as_base`: (key, value) pairs that mean what the base
    config already does; `not_for`: keys that legitimately do not reach the native config, with the reason."""

    backbone: str
    base: dict[str, Any]
    translate: Callable[[Any], Any]
    values: dict[str, list[Any]] = field(default_factory=dict)
    context: dict[str, dict[str, Any]] = field(default_factory=dict)
    same_as_base: dict[tuple[str, Any], str] = field(default_factory=dict)
    not_for: dict[str, str] = field(default_factory=dict)
    _translated: dict[str, Any] = field(default_factory=dict, repr=False)

    def keys(self) -> list[tuple[str, Any]]:
        return leaf_keys(config_model())

    def cases(self) -> list[tuple[str, Any]]:
        return [(key, value) for key, annotation in self.keys() for value in self.values_for(key, annotation)]

    @staticmethod
    def case_id(case: Any) -> str:
        return repr(case)

    def default_of(self, key: str) -> Any:
        node: Any = build(self.base)
        for part in key.split("."):
            node = getattr(node, part) if isinstance(node, BaseModel) else node[part]
        return node.root if isinstance(node, RootModel) else node

    def values_for(self, key: str, annotation: Any) -> list[Any]:
        if key in self.values:
            return self.values[key]
        current, inner = self.default_of(key), _unwrap(annotation)
        if inner is bool:
            return [not current]
        if typing.get_origin(inner) is typing.Literal:
            return [option for option in typing.get_args(inner) if option != current]
        if inner is int and current is not None:
            return [current + 1]
        if inner is float and current is not None:
            return [current + 0.5]
        raise AssertionError(f"{key}: add a non-default value for it to the walk's values")

    def _translate_data(self, data: dict[str, Any]) -> Any:
        text = json.dumps(data, sort_keys=True)
        if text not in self._translated:
            self._translated[text] = self.translate(build(data))
        return self._translated[text]

    def outcome(self, key: str, value: Any) -> tuple[str, str]:
        """('changed' | 'refused' | 'unchanged', detail) for `key` set to `value` on top of its context."""
        base = copy.deepcopy(self.base)
        for context_key, context_value in self.context.get(key, {}).items():
            set_path(base, context_key, context_value)
        with_key = copy.deepcopy(base)
        set_path(with_key, key, value)
        config = build(with_key)  # a valid agenttune config: refusals below are the backbone's
        try:
            before = self._translate_data(base)
        except UserError as error:
            # The key means something only in a context the backbone refuses (a threshold of a refused
            # correction): that refusal must name the context, and it stands with the key set too.
            assert any(name in str(error) for name in self.context.get(key, {})), (
                f"the context of {key} is refused: {error}")
            try:
                self.translate(config)
            except UserError:
                return "refused", str(error)
            raise AssertionError(f"{key}={value!r} is accepted although its context is refused: {error}") from None
        try:
            after = self.translate(config)
        except UserError as error:
            named = [name for name in (key, *self.context.get(key, {})) if name in str(error)]
            assert named, f"{key}={value!r} is refused, but the error does not name the key: {error}"
            return "refused", str(error)
        return ("changed", "") if after != before else ("unchanged", "")

    def exempt(self, key: str) -> bool:
        return key in self.not_for or key.split(".", 1)[0] in OTHER_BACKBONES

    def check(self, key: str, value: Any) -> None:
        """The key reached the native config, was refused naming it, or is exempt with its reason."""
        result, _ = self.outcome(key, value)
        if result == "unchanged" and not any((key, value) == same for same in self.same_as_base):
            assert self.exempt(key), (f"{key}={value!r} is silently dropped: the generated {self.backbone} config "
                                      "does not change and nothing refuses it")
        elif result == "changed":
            assert not self.exempt(key), f"{key} reaches {self.backbone}'s config: remove it from the exempt keys"

    def check_tables(self) -> None:
        """Every key is walked, and every table names real keys (no stale entries)."""
        keys = {key for key, _ in self.keys()}
        assert keys == {key for key, _ in self.cases()}
        for table in (self.values, self.context, self.not_for, {key: None for key, _ in self.same_as_base}):
            assert set(table) <= keys, f"not config keys: {sorted(set(table) - keys)}"
        assert set(OTHER_BACKBONES) & {key.split(".", 1)[0] for key in keys}, "the built-in backbones' sections"
