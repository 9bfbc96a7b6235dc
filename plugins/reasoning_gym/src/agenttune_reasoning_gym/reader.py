"""The `reasoning_gym` task reader: tasks from a reasoning-gym generator, generated on the spot.

    task_reader:
      type: reasoning_gym
      dataset: basic_arithmetic          # any generator by name
      config: {min_terms: 2, max_terms: 2, max_digits: 1}
      seed: 42
      splits: {train: null, test: 200}   # size per split; null: endless
      validation_split: test

or a weighted mix (reasoning-gym's composite dataset):

      datasets:
        basic_arithmetic: {weight: 2, config: {max_digits: 2}}
        spell_backward: {weight: 1}

Each split draws from its own item stream (a seed derived from `seed` and the split's name). The first
split listed is the training split: it skips every question that appears in the other (sized)
splits, so held-out questions are never trained on, even for generators with few distinct questions.
A Task holds the question as its query, the answer as `metadata.ground_truth`, and under
`metadata.reasoning_gym` the entry and the generator that the judge's `score_answer` needs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agenttune.plugin_api import Task, TaskReader, UserError
from agenttune_reasoning_gym.generators import GeneratorSpec, check_spec, derive_seed, entries, import_modules

METADATA_KEY = "reasoning_gym"
# Candidates the training split may skip in a row (held-out questions) before it gives up: past it the
# generator's questions are all held out, and reading on would spin until task_reader.read_timeout.
MAX_SKIPPED_IN_A_ROW = 10_000


class MixedGenerator(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: float = Field(default=1.0, gt=0, description="Relative share of this generator's items.")
    config: dict[str, Any] = Field(default_factory=dict, description="The generator's config options.")


class ReasoningGymReaderOptions(BaseModel):
    """Options of the `reasoning_gym` task reader."""

    model_config = ConfigDict(extra="forbid")

    dataset: str | None = Field(default=None, description="Generator name, e.g. basic_arithmetic "
                                                          "(or use `datasets` for a weighted mix).")
    config: dict[str, Any] = Field(default_factory=dict,
                                   description="The generator's config options (not seed or size).")
    datasets: dict[str, MixedGenerator] | None = Field(
        default=None, description="A weighted mix instead of `dataset`: name -> {weight, config}.")
    imports: list[str] = Field(default_factory=list, description="Modules to import first: they register "
                                                              "generators of your own (reasoning_gym.register_dataset).")
    seed: int = Field(default=0, description="Base seed; each split's seed is derived from it and the split's name.")
    splits: dict[str, int | None] = Field(
        default_factory=lambda: dict[str, int | None](train=1000, test=200),
        description="Split name -> number of tasks (null: endless). The first split is the training split: "
                    "it never repeats a question of the other sized splits.")

    @model_validator(mode="after")
    def _one_source(self) -> ReasoningGymReaderOptions:
        if (self.dataset is None) == (self.datasets is None):
            raise ValueError("set exactly one of `dataset` (a generator name) and `datasets` (a weighted mix)")
        if self.datasets is not None and self.config:
            raise ValueError("`config` goes with `dataset`; in a mix, give each generator its own `config`")
        if not self.splits:
            raise ValueError("`splits` names no split")
        bad = [name for name, size in self.splits.items() if size is not None and size <= 0]
        if bad:
            raise ValueError(f"split sizes must be positive or null (endless): {', '.join(bad)}")
        return self

    @property
    def spec(self) -> GeneratorSpec:
        if self.datasets is None:
            assert self.dataset is not None
            return GeneratorSpec({self.dataset: dict(self.config)})
        return GeneratorSpec({name: dict(mix.config) for name, mix in self.datasets.items()},
                             weights={name: mix.weight for name, mix in self.datasets.items()})


class ReasoningGymTaskReader(TaskReader):
    """Tasks from a reasoning-gym generator (or a weighted mix), seeded, sized or endless."""

    name: ClassVar[str] = "reasoning_gym"
    Options: ClassVar[type[BaseModel]] = ReasoningGymReaderOptions
    options: ReasoningGymReaderOptions

    def check(self, splits: list[str]) -> None:
        for split in splits:
            self._size(split)
        import_modules(self.options.imports, "task_reader")
        check_spec(self.options.spec, "task_reader")

    def endless(self, split: str) -> bool:
        return self._size(split) is None

    def read(self, split: str) -> Iterator[Task]:
        size = self._size(split)
        import_modules(self.options.imports, "task_reader")
        held_out = self._held_out_questions() if split == self._training_split else set()
        tasks = self._tasks(split, held_out)
        return tasks if size is None else islice(tasks, size)

    @property
    def _training_split(self) -> str:
        return next(iter(self.options.splits))

    def _size(self, split: str) -> int | None:
        if split not in self.options.splits:
            raise UserError(f"task_reader.splits has no split {split!r} (it has: {', '.join(self.options.splits)}).",
                            hint=f"Add `{split}: N` (N tasks, or null for endless) under task_reader.splits, or "
                                 "set task_reader.train_split / validation_split to one of those names.")
        return self.options.splits[split]

    def _held_out_questions(self) -> set[str]:
        """The questions of every sized split but the training one."""
        questions: set[str] = set()
        for split, size in self.options.splits.items():
            if split != self._training_split and size is not None:
                questions.update(task.query for task in islice(self._tasks(split, set()), size))
        return questions

    def _tasks(self, split: str, skip: set[str]) -> Iterator[Task]:
        spec, index, skipped = self.options.spec, 0, 0
        for entry in entries(spec, derive_seed(self.options.seed, split)):
            if entry["question"] in skip:
                skipped += 1
                if skipped >= MAX_SKIPPED_IN_A_ROW:
                    raise UserError(
                        f"The training split {split!r} of reasoning-gym {spec.describe()} found only held-out "
                        f"questions in {skipped} tries: the generator has too few distinct questions for the "
                        f"held-out splits' sizes.",
                        hint="Make the held-out splits smaller, or the generator's config harder (more digits, "
                             "terms, ...), so that questions remain to train on.")
                continue
            skipped = 0
            yield _task(split, index, entry, spec, self.options.imports)
            index += 1


def _task(split: str, index: int, entry: dict[str, Any], spec: GeneratorSpec, imports: list[str]) -> Task:
    # JSON-safe (tuples become lists), as the entry would be after a round trip through a dataset file.
    entry = json.loads(json.dumps(entry, default=str))
    source = entry.get("metadata", {}).get("source_dataset") or next(iter(spec.configs))
    return Task(task_id=f"{split}-{index}", query=entry["question"], metadata={
        "ground_truth": entry["answer"],
        METADATA_KEY: {"dataset": source, "config": spec.configs.get(source, {}), "entry": entry,
                       "imports": imports},  # the judge imports them too (in its worker processes)
    })
