"""`agenttune.Trainer`: train from Python, on the very code path of `agenttune train`.

    from agenttune import Trainer

    run = Trainer("my_agent.yaml", workflow=MyWorkflow, judge="math",
                  train_dataset=datasets.load_dataset(...), test_dataset="data/test.jsonl",
                  backbone="local").train()

The config (a YAML path, a dict, an `AgentTuneConfig`, or nothing) is loaded by `load_config`, as the
CLI loads `--conf`; the keyword arguments then replace what they name:

    workflow=       a Workflow subclass or 'module:Class'                  -> `workflow`
    judge=          a Judge subclass, 'module:Class' or a judge name       -> `judge.type` / `judge_protocol`
    train_dataset=  a path (file reader) or a datasets.Dataset / list of   -> the `task_reader` section
    test_dataset=   rows / list of Tasks (in_memory reader)                   (validation split: `test`
                                                                              unless the config names one)
    backbone=, agent_framework=, overrides=["key.path=value", ...]       -> as the CLI's flags

Objects no module path reaches (a class in a script, a dataset in memory) are kept in
`agenttune.config.in_process` and named there, so the resolved config still names every component.
`train()` then calls `training.train_from_config`, exactly what `agenttune train` calls.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agenttune.components.readers.columns import ColumnOptions
from agenttune.config.in_process import keep, reference_for
from agenttune.config.models import AgentTuneConfig, JudgeConfig, TaskReaderConfig
from agenttune.errors import UserError
from agenttune.registry.config_loading import build_config, load_config

if TYPE_CHECKING:
    from agenttune.config.run import Run

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | AgentTuneConfig | None
DEFAULT_VALIDATION_SPLIT = "test"


class Trainer:
    """One training run, configured from Python. `train()` runs it and returns the `Run`."""

    def __init__(
        self,
        config: ConfigSource = None,
        *,
        workflow: type | str | None = None,
        judge: type | str | None = None,
        train_dataset: Any = None,
        test_dataset: Any = None,
        backbone: str | None = None,
        agent_framework: str | None = None,
        overrides: Sequence[str] = (),
        run_dir: str | os.PathLike[str] | None = None,
        resume: bool = False,
    ):
        self.config = training_config(config, workflow=workflow, judge=judge, train_dataset=train_dataset,
                                      test_dataset=test_dataset, backbone=backbone,
                                      agent_framework=agent_framework, overrides=overrides)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.resume = resume
        self.run: Run | None = None

    def train(self) -> Run:
        from agenttune.entrypoints.train import train_from_config

        self.run = train_from_config(self.config, run_dir=self.run_dir, resume=self.resume)
        return self.run


def training_config(config: ConfigSource = None, *, workflow: type | str | None = None,
                    judge: type | str | None = None, train_dataset: Any = None, test_dataset: Any = None,
                    backbone: str | None = None, agent_framework: str | None = None,
                    overrides: Sequence[str] = ()) -> AgentTuneConfig:
    """The configuration `Trainer` runs: `config` loaded as the CLI loads it, then the arguments applied."""
    if config is not None and not isinstance(config, (str, os.PathLike, Mapping, AgentTuneConfig)):
        raise UserError(f"Trainer(config=...) got a {type(config).__name__}.",
                        hint="Pass the path of a YAML config file, a dict with its contents, or an AgentTuneConfig.")
    base = load_config(config, list(overrides), backbone=backbone, agent_framework=agent_framework)
    changes: dict[str, Any] = {}
    if workflow is not None:
        changes["workflow"] = code_reference(workflow, "workflow")
    if judge is not None:
        changes["judge"] = judge_section(base.judge, judge)
    if train_dataset is not None or test_dataset is not None:
        changes["task_reader"] = task_reader_section(base.task_reader, train_dataset, test_dataset)
    resolved = with_changes(base, changes)
    _warn_if_unused_validation(resolved, test_dataset)
    return resolved


def with_changes(config: AgentTuneConfig, changes: dict[str, Any]) -> AgentTuneConfig:
    """`config` with whole top-level keys replaced, validated again."""
    if not changes:
        return config
    changed = build_config({}, {**config.model_dump(), **changes}, source="the Trainer's arguments")
    changed._source_dir = config.source_dir
    return changed


def code_reference(value: type | str, key: str) -> str:
    """A 'module:Name' for a class (kept in agenttune.config.in_process when not importable), or the string given."""
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return reference_for(value)
    raise UserError(f"Trainer({key}=...) got a {type(value).__name__} instance.",
                    hint=f"Pass the class itself or a 'package.module:Class' reference for {key}.")


def judge_section(current: JudgeConfig, judge: type | str) -> dict[str, Any]:
    """The judge section for `judge=`: a registered name, or a class (custom). Other keys are kept."""
    section = current.model_dump()
    if isinstance(judge, str) and ":" not in judge and "->" not in judge:
        return {**section, "type": judge, "judge_protocol": None}
    return {**section, "type": "custom", "judge_protocol": code_reference(judge, "judge")}


def task_reader_section(current: TaskReaderConfig, train: Any, test: Any) -> dict[str, Any]:
    """A `file` reader for paths, an `in_memory` reader for datasets; the column options are kept."""
    if train is None:
        raise UserError("Trainer got test_dataset but no train_dataset.",
                        hint="Pass train_dataset too (one task reader serves both), or name both in the config.")
    splits = {current.train_split: train}
    validation_split = current.validation_split
    if test is not None:
        validation_split = validation_split or DEFAULT_VALIDATION_SPLIT
        splits[validation_split] = test
    columns = {key: value for key, value in current.options().items() if key in ColumnOptions.model_fields}
    common = {"train_split": current.train_split, "validation_split": validation_split, **columns}
    paths = [isinstance(data, (str, os.PathLike)) for data in splits.values()]
    if all(paths):
        return {"type": "file", "path": {split: os.fspath(data) for split, data in splits.items()}, **common}
    if any(paths):
        raise UserError("Trainer got one dataset as a path and the other as an object.",
                        hint="Pass both as paths (.jsonl, .json, .parquet) or both as datasets.Dataset objects "
                             "(e.g. datasets.load_dataset('json', data_files=PATH, split='train')).")
    return {"type": "in_memory", "splits": {split: _dataset_reference(data, split) for split, data in splits.items()},
            **common}


def _dataset_reference(data: Any, split: str) -> str:
    if isinstance(data, (bytes, Mapping)) or not hasattr(data, "__iter__"):
        raise UserError(f"The {split!r} dataset is a {type(data).__name__}.",
                        hint="Pass a path, a datasets.Dataset, a list of dicts (one per task) or a list of Tasks.")
    return keep(data, label=f"{split}_dataset")


def _warn_if_unused_validation(config: AgentTuneConfig, test_dataset: Any) -> None:
    if test_dataset is not None and not (config.trainer.test_freq or config.trainer.val_before_train):
        warnings.warn("test_dataset is given, but trainer.test_freq is 0 and trainer.val_before_train is false, "
                      "so training never validates on it; set trainer.test_freq=N to validate every N steps.",
                      UserWarning, stacklevel=3)
