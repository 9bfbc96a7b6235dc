"""Plugin discovery end to end: real distributions, written here, pip-installed into a throwaway venv
that sees this environment's packages, listed by the real `agenttune` command, then uninstalled.

Three distributions: a working plugin (a task reader, a judge and a command), a plugin whose module
fails to import, and one that clashes with the working one (disabled except where the clash is tested).
Two more written against older import paths (issue 36): one through a module that moved (it loads,
with a deprecation warning), one importing a name from a module that never had it (it is broken, and
told where the name lives).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

WORKING = '''
from pydantic import BaseModel, ConfigDict

from agenttune import Judge, JudgeResult, Task, hookimpl
from agenttune.components.readers.base import TaskReader


class CountdownOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    numbers: int = 3


class CountdownReader(TaskReader):
    name = "countdown"
    Options = CountdownOptions

    def read(self, split):
        for n in range(self.options.numbers):
            yield Task(task_id=f"{split}-{n}", query=f"Count down from {n}.", metadata={"ground_truth": n})


class ExactMatchJudge(Judge):
    name = "exact_match"

    def judge(self, judge_input):
        solved = str(judge_input.final_answer).strip() == str(judge_input.task.ground_truth)
        return JudgeResult(reward=float(solved), success=solved)


@hookimpl
def register_task_readers():
    return [CountdownReader]


@hookimpl
def register_judges():
    return [ExactMatchJudge]


@hookimpl
def register_commands(app):
    @app.command("countdown-hello")
    def hello():
        """Say hello from an installed plugin."""
        print("hello from agenttune-plugin-countdown")
'''

BROKEN = '''
raise ImportError("this plugin needs gpu_only_library, which is not installed")
'''

CLASHING = '''
from agenttune import hookimpl
from agenttune.components.readers.base import TaskReader


class AnotherCountdown(TaskReader):
    name = "countdown"


@hookimpl
def register_task_readers():
    return [AnotherCountdown]
'''


# Written for agenttune 0.1, whose docs showed these imports.
OLD_RELEASE = '''
from agenttune.task_reader import TaskReader
from agenttune import Task, hookimpl


class EchoReader(TaskReader):
    name = "echo"

    def read(self, split):
        yield Task(task_id=f"{split}-0", query="echo", metadata={"ground_truth": "echo"})


@hookimpl
def register_task_readers():
    return [EchoReader]
'''

MISPLACED = '''
from agenttune.components.readers.base import Judge
'''


def write_distribution(root: Path, distribution: str, module: str, entry_point: str, code: str) -> Path:
    directory = root / distribution
    directory.mkdir(parents=True)
    (directory / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{distribution}"
        version = "0.3.1"

        [project.entry-points.agenttune]
        {entry_point} = "{module}"

        [tool.setuptools]
        py-modules = ["{module}"]
        """), encoding="utf-8")
    (directory / f"{module}.py").write_text(code, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv whose python also sees this environment's site-packages (agenttune, pip, setuptools)."""
    root = tmp_path_factory.mktemp("plugin-install")
    path = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    own_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    parent_site = sysconfig.get_paths()["purelib"]
    # addsitedir (not a bare path) so the editable agenttune install's own .pth is processed too
    Path(own_site, "parent_environment.pth").write_text(f"import site; site.addsitedir({parent_site!r})\n")
    sources = root / "src"
    distributions = [
        write_distribution(sources, "agenttune-plugin-countdown", "agenttune_countdown", "countdown", WORKING),
        write_distribution(sources, "agenttune-plugin-broken", "agenttune_broken", "broken", BROKEN),
        write_distribution(sources, "agenttune-plugin-clash", "agenttune_clash", "clash", CLASHING),
        write_distribution(sources, "agenttune-plugin-echo", "agenttune_echo", "echo", OLD_RELEASE),
        write_distribution(sources, "agenttune-plugin-misplaced", "agenttune_misplaced", "misplaced", MISPLACED),
    ]
    pip(path, "install", "--no-build-isolation", "--no-index", "--no-deps", "--quiet", *map(str, distributions))
    return path


def pip(venv: Path, *args: str) -> None:
    subprocess.run([venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check", *args],
                   check=True, capture_output=True, timeout=300)


def agenttune(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("AGENTTUNE_")}
    environment.setdefault("AGENTTUNE_DISABLE_PLUGINS", "clash")
    environment.update(env)
    environment = {key: value for key, value in environment.items() if value != ""}
    return subprocess.run([venv / "bin" / "python", "-m", "agenttune", *args], capture_output=True, text=True,
                          env=environment, timeout=120)


def listed(venv: Path, **env: str) -> dict[str, dict]:
    result = agenttune(venv, "plugins", "list", "--json", **env)
    assert result.returncode == 0, result.stderr
    return {entry["name"]: entry for entry in json.loads(result.stdout)}


@pytest.mark.slow
def test_installed_plugins_are_listed_with_what_they_provide(venv):
    plugins = listed(venv)
    countdown = plugins["countdown"]
    assert countdown["distribution"] == "agenttune-plugin-countdown"
    assert countdown["version"] == "0.3.1"
    assert countdown["task_readers"] == ["countdown"] and countdown["judges"] == ["exact_match"]
    assert countdown["error"] is None
    assert {"file", "huggingface"} <= set(plugins["builtins"]["task_readers"])
    assert "clash" not in plugins  # disabled by AGENTTUNE_DISABLE_PLUGINS


@pytest.mark.slow
def test_a_plugin_that_fails_to_import_is_listed_as_broken_and_the_cli_keeps_working(venv):
    result = agenttune(venv, "plugins", "list", "--json")
    broken = {entry["name"]: entry for entry in json.loads(result.stdout)}["broken"]
    assert broken["distribution"] == "agenttune-plugin-broken"
    assert broken["error"] == "ImportError: this plugin needs gpu_only_library, which is not installed"
    assert "Warning: agenttune plugin 'broken' (agenttune-plugin-broken) failed to load" in result.stderr
    assert "Traceback" not in result.stderr
    table = agenttune(venv, "plugins", "list")
    assert table.returncode == 0 and "BROKEN" in table.stdout


@pytest.mark.slow
def test_installed_components_work_from_a_config(venv, tmp_path):
    conf = tmp_path / "countdown.yaml"
    conf.write_text("task_reader:\n  type: countdown\n  numbers: 2\n", encoding="utf-8")
    result = agenttune(venv, "data", "preview", "--conf", str(conf), "--json")
    assert result.returncode == 0, result.stderr
    tasks = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(task["task_id"], task["query"]) for task in tasks] == [
        ("train-0", "Count down from 0."), ("train-1", "Count down from 1.")]
    command = agenttune(venv, "countdown-hello")
    assert (command.returncode, command.stdout) == (0, "hello from agenttune-plugin-countdown\n")


@pytest.mark.slow
def test_load_and_disable_lists(venv):
    only = listed(venv, AGENTTUNE_LOAD_PLUGINS="agenttune-plugin-countdown")
    assert set(only) == {"builtins", "countdown"}  # the built-ins always load
    by_entry_point = listed(venv, AGENTTUNE_LOAD_PLUGINS="broken", AGENTTUNE_DISABLE_PLUGINS="")
    assert set(by_entry_point) == {"builtins", "broken"}
    without = listed(venv, AGENTTUNE_DISABLE_PLUGINS="countdown,agenttune-plugin-broken,clash")
    assert "builtins" in without and not {"countdown", "broken", "clash"} & set(without)


def test_trace_shows_loads_and_hook_calls(venv):
    result = agenttune(venv, "plugins", "list", "--json", AGENTTUNE_TRACE_PLUGINS="1")
    assert "[agenttune trace] load countdown = agenttune_countdown (agenttune-plugin-countdown 0.3.1)" in result.stderr
    assert "[agenttune trace] register_task_readers() <- countdown (agenttune-plugin-countdown): [<class" in result.stderr
    assert "[agenttune trace] register_judges() <- countdown" in result.stderr


def test_two_distributions_providing_one_name_stop_with_both_named(venv):
    result = agenttune(venv, "plugins", "list", AGENTTUNE_DISABLE_PLUGINS="")
    assert result.returncode == 2
    assert "Two plugins provide a task reader named 'countdown'" in result.stderr
    assert "agenttune-plugin-countdown" in result.stderr and "agenttune-plugin-clash" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_uninstalled_plugins_disappear(venv):
    pip(venv, "uninstall", "--yes", "--quiet", "agenttune-plugin-countdown")
    try:
        assert "countdown" not in listed(venv)
    finally:
        pip(venv, "install", "--no-build-isolation", "--no-index", "--no-deps", "--quiet",
            str(venv.parent / "src" / "agenttune-plugin-countdown"))


@pytest.mark.slow
def test_a_plugin_written_for_the_previous_release_loads_and_is_told_the_new_import(venv, tmp_path):
    result = agenttune(venv, "plugins", "list", "--json")
    echo = {entry["name"]: entry for entry in json.loads(result.stdout)}["echo"]
    assert echo["error"] is None and echo["task_readers"] == ["echo"]
    [deprecation] = echo["deprecations"]
    assert deprecation.startswith("agenttune.task_reader moved to agenttune.components.readers.base in agenttune 0.2")
    assert "`from agenttune.plugin_api import TaskReader`" in deprecation
    assert ("Warning: agenttune plugin 'echo' (agenttune-plugin-echo) uses a deprecated import: "
            "agenttune.task_reader moved") in result.stderr
    table = agenttune(venv, "plugins", "list", COLUMNS="400")
    assert "DEPRECATED IMPORT" in table.stdout
    conf = tmp_path / "echo.yaml"
    conf.write_text("task_reader:\n  type: echo\n", encoding="utf-8")
    preview = agenttune(venv, "data", "preview", "--conf", str(conf), "--json")
    assert preview.returncode == 0, preview.stderr
    assert json.loads(preview.stdout.splitlines()[0])["task_id"] == "train-0"


@pytest.mark.slow
def test_a_plugin_broken_by_an_agenttune_import_is_told_where_the_name_lives(venv, tmp_path):
    listed_now = {entry["name"]: entry for entry in json.loads(agenttune(venv, "plugins", "list", "--json").stdout)}
    assert listed_now["misplaced"]["error"] == (
        "ImportError: cannot import name 'Judge' from 'agenttune.components.readers.base' "
        f"({Path(importlib.import_module('agenttune.components.readers.base').__file__)}). Judge is not in "
        "agenttune.components.readers.base: import it from the plugin API, `from agenttune.plugin_api import Judge`.")
    # `train` naming a component of an installed but broken plugin: no "install the plugin" as if it were absent
    conf = tmp_path / "missing.yaml"
    conf.write_text("task_reader:\n  type: misplaced_reader\n", encoding="utf-8")
    result = agenttune(venv, "train", "--conf", str(conf), "--backbone", "debug", COLUMNS="400")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unknown task reader 'misplaced_reader'" in result.stderr
    error = result.stderr.replace("\n", " ").split("Error: ", 1)[1]
    assert "Installed plugins that failed to load, and so provide nothing: " in error
    assert "misplaced (agenttune-plugin-misplaced): ImportError: cannot import name 'Judge'" in error
    assert "`from agenttune.plugin_api import Judge`" in error and "broken (agenttune-plugin-broken)" in error
    assert "If one of them provides it, fix that plugin" in error
