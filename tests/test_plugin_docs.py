"""What docs/plugins.md tells a plugin author, checked against what agenttune does (issue 36 item 3):
the warnings it quotes, the pyproject example, task.ground_truth, and which keys a reader's Options
declares."""

from __future__ import annotations

import re
import sys
import tomllib
import warnings
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from agenttune.errors import PluginWarning
from agenttune.plugin_api import Task, TaskReader, hookimpl
from agenttune.registry.manager import PluginManager

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")


def quoted_warnings() -> list[str]:
    """Every `Warning: agenttune plugin 'x' (dist) ...:` the docs quote, up to its colon."""
    flat = re.sub(r"\s+", " ", DOCS)
    return re.findall(r"`(Warning: agenttune plugin 'x' \(dist\) [^`:]+:)", flat)


def emitted(load) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load()
    return [f"Warning: {warning.message}" for warning in caught if issubclass(warning.category, PluginWarning)]


def test_the_warnings_the_docs_quote_are_the_ones_agenttune_prints(tmp_path, monkeypatch):
    (tmp_path / "docs_broken_plugin.py").write_text("import gpu_only_library\n", encoding="utf-8")
    (tmp_path / "docs_old_plugin.py").write_text("from agenttune.task_reader import TaskReader\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    manager = PluginManager()

    def load(module: str):
        return lambda: manager._load_entry_point(EntryPoint("x", module, "agenttune"), "dist")

    class RaisingHook:
        @staticmethod
        @hookimpl
        def register_judges():
            raise RuntimeError("no judges today")

    def hook_raises():
        manager.register(RaisingHook(), name="x", distribution="dist")
        manager.components()

    sys.modules.pop("agenttune.task_reader", None)  # the shim warns on its first import in a process
    printed = emitted(load("docs_broken_plugin")) + emitted(load("docs_old_plugin")) + emitted(hook_raises)
    quoted = quoted_warnings()
    assert len(quoted) == 3, quoted  # failed to load, is broken, uses a deprecated import
    for text in quoted:
        assert any(line.startswith(text) for line in printed), (text, printed)


def test_the_pyproject_example_builds_and_pins_the_release_line():
    [example] = [block for block in re.findall(r"```toml\n(.*?)```", DOCS, re.DOTALL) if "[project]" in block]
    project = tomllib.loads(example)
    assert project["build-system"]["build-backend"] and project["build-system"]["requires"]
    assert project["project"]["entry-points"]["agenttune"] == {"hello": "agenttune_hello"}
    assert project["project"]["dependencies"] == ["agenttune>=0.2,<0.3"]


def test_ground_truth_reads_metadata_ground_truth():
    assert 'task.ground_truth` reads `metadata["ground_truth"]`' in re.sub(r"\s+", " ", DOCS)
    assert Task(task_id="t", query="q", metadata={"ground_truth": 7}).ground_truth == 7
    assert Task(task_id="t", query="q").ground_truth is None


class StrictOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int = 2


class SplitReader(TaskReader):
    name = "docs_splits"
    Options = StrictOptions

    def read(self, split):
        for n in range(self.options.count):
            yield Task(task_id=f"{split}-{n}", query=f"{split} {n}")


@pytest.mark.parametrize("split", ["train", "validation", "dev"])
def test_a_readers_options_do_not_declare_the_splits(register_plugin, run_cli, write_yaml, split):
    """As the docs say: train_split and validation_split are every task_reader section's, not the
    reader's Options (extra="forbid" here), and the reader is asked for the split by name."""
    assert "does not declare `train_split` or `validation_split`" in re.sub(r"\s+", " ", DOCS)
    register_plugin(task_readers=[SplitReader])
    conf = write_yaml({"task_reader": {"type": "docs_splits", "count": 1, "train_split": "dev",
                                       "validation_split": "validation"}})
    result = run_cli("data", "preview", "--conf", conf, "--json", *(["--split", split] if split != "dev" else []))
    assert result.exit_code == 0, result.output
    assert f'"task_id":"{split}-0"' in result.stdout
