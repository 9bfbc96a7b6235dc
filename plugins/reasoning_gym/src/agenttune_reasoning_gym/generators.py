"""reasoning-gym generators by name: checked configs, seeded chunks, and the scorer of an entry.

A generator is a registered reasoning-gym dataset class (`reasoning_gym.factory.DATASETS`) with a
config dataclass. A `GeneratorSpec` is one generator with its config, or a weighted mix of several
(reasoning-gym's `composite` dataset). Mistakes -- an unknown name, a key the config does not have, a
value its `validate()` refuses -- become one-paragraph `UserError`s naming the `task_reader` key.

`seed` and `size` belong to the reader (task_reader.seed and task_reader.splits), never to a config:
the reader derives a seed per split and per chunk, so that splits do not share an item stream.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import json
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from agenttune.plugin_api import UserError

# The reader's own keys: a config that sets them would fight the reader's seeding and split sizes.
READER_KEYS = ("seed", "size")
# Items per generated chunk. Each chunk is a fresh dataset with its own derived seed, so that
# generators which pre-build `size` items (or index them modulo size) never see an index past it.
CHUNK = 1000

Scorer = Callable[[str | None, dict[str, Any]], float]


@dataclasses.dataclass(frozen=True)
class GeneratorSpec:
    """One generator (`weights` is None) or a weighted mix of `configs`' generators."""

    configs: dict[str, dict[str, Any]]
    weights: dict[str, float] | None = None

    def describe(self) -> str:
        return next(iter(self.configs)) if self.weights is None else "composite(" + ", ".join(self.configs) + ")"


def registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's generators: name -> (dataset class, config class). Imports reasoning-gym."""
    import reasoning_gym  # noqa: F401  (registers every generator)
    from reasoning_gym.factory import DATASETS

    return {name: classes for name, classes in DATASETS.items() if name != "composite"}


def import_modules(names: list[str], key: str) -> None:
    """Import the modules that register generators of one's own (`reasoning_gym.register_dataset`)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:  # whatever the module raises while it registers
            raise UserError(f"{key}.imports: module {name!r} could not be imported: {type(error).__name__}: {error}",
                            hint="Name an importable module (on PYTHONPATH, or installed) that registers your "
                                 "generators with reasoning_gym.register_dataset.") from error


def check_spec(spec: GeneratorSpec, key: str) -> None:
    """Raise a UserError unless every generator exists and its config builds a dataset."""
    for name, config in spec.configs.items():
        _check_config(name, config, key)
        build(GeneratorSpec({name: config}), seed=0, size=1)


def _check_config(name: str, config: dict[str, Any], key: str) -> None:
    generators = registry()
    if name not in generators:
        close = difflib.get_close_matches(name, list(generators), n=5, cutoff=0.5)
        near = f" Close names: {', '.join(close)}." if close else ""
        raise UserError(f"{key}: reasoning-gym {_version()} has no generator {name!r}.{near}",
                        hint=f"Its {len(generators)} generators are listed by `python -c \"import reasoning_gym.factory "
                             f"as f, reasoning_gym; print(sorted(f.DATASETS))\"` (docs/reasoning_gym.md).")
    fields = [field.name for field in dataclasses.fields(generators[name][1])]
    reader_keys = sorted(set(config) & set(READER_KEYS))
    if reader_keys:
        raise UserError(f"{key}: {', '.join(reader_keys)} cannot be set in the config of generator {name!r}.",
                        hint="Set task_reader.seed for the seed and task_reader.splits for each split's size; the "
                             "reader derives a seed per split so that splits do not overlap.")
    unknown = sorted(set(config) - set(fields))
    if unknown:
        allowed = [field for field in fields if field not in READER_KEYS]
        raise UserError(f"{key}: generator {name!r} has no option {', '.join(map(repr, unknown))}.",
                        hint=f"Its options are: {', '.join(allowed)}.")


def build(spec: GeneratorSpec, *, seed: int, size: int) -> Any:
    """A reasoning-gym dataset of `size` items for `spec` with `seed`; a UserError for a bad config value."""
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec
    from reasoning_gym.factory import create_dataset

    try:
        if spec.weights is None:
            name, config = next(iter(spec.configs.items()))
            return create_dataset(name, **config, seed=seed, size=size)
        specs = [DatasetSpec(name=name, weight=spec.weights[name], config=dict(config))
                 for name, config in spec.configs.items()]
        return CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))
    except (AssertionError, ValueError, TypeError) as error:  # the config's validate() asserts
        raise UserError(f"reasoning-gym refused the config of {spec.describe()}: {error or type(error).__name__}.",
                        hint="Check the values under task_reader.config (or task_reader.datasets) against the "
                             "generator's options (docs/reasoning_gym.md).") from error


def entries(spec: GeneratorSpec, seed: int) -> Iterator[dict[str, Any]]:
    """The endless stream of `spec`'s items for `seed`: chunk after chunk, each with its own derived seed."""
    chunk = 0
    while True:
        dataset = build(spec, seed=derive_seed(seed, "chunk", chunk), size=CHUNK)
        for index in range(CHUNK):
            yield dataset[index]
        chunk += 1


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from `parts`, stable across processes and Python versions (no `hash()`).

    reasoning-gym seeds item i with `seed + i`, so seeds that differ by less than a split's size would
    share most of their items: hashed seeds put the streams far apart.
    """
    digest = hashlib.sha256(json.dumps(parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@lru_cache(maxsize=64)
def scorer(name: str, config_json: str) -> Scorer:
    """`score_answer` of generator `name` built with its config (some scorers read their config)."""
    config = json.loads(config_json)
    return build(GeneratorSpec({name: config}), seed=0, size=1).score_answer


def _version() -> str:
    from importlib.metadata import version

    return version("reasoning-gym")
