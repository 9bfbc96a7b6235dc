"""The plugin system in one process: registration, the registry's errors, isolation of broken hooks,
tracing, plugin commands, and the hook reference in docs/plugins.md.
(Discovery of installed distributions is tested in test_core_plugin_install.py.)"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from agenttune import hookimpl
from agenttune.components.judges.base import Judge, JudgeResult
from agenttune.components.readers.base import TaskReader
from agenttune.errors import PluginError, PluginWarning
from agenttune.registry import hookspecs
from agenttune.registry.manager import (
    KINDS,
    PluginManager,
    get_component,
    get_plugin_manager,
    registered_plugin,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


class ConstantJudge(Judge):
    name = "constant"

    def judge(self, judge_input):
        return JudgeResult(reward=1.0)


class OtherConstantJudge(ConstantJudge):
    """Same name, different class: a clash."""


class NamelessReader(TaskReader):
    pass


def test_the_fixture_registers_for_one_test_only():
    with registered_plugin(judges=[ConstantJudge], name="temporary") as plugin:
        assert get_component("judges", "constant") is ConstantJudge
        assert get_plugin_manager().pm.is_registered(plugin)
    with pytest.raises(PluginError, match="unknown judge 'constant'"):
        get_component("judges", "constant")
    assert "temporary" not in get_plugin_manager().plugins


def test_register_plugin_fixture_accepts_a_module_like_object(register_plugin):
    class Plugin:
        @staticmethod
        @hookimpl
        def register_judges():
            return [ConstantJudge]

    register_plugin(Plugin(), name="object-plugin", distribution="my-dist")
    assert get_component("judges", "constant") is ConstantJudge
    (info,) = [info for info in get_plugin_manager().infos() if info.name == "object-plugin"]
    assert info.distribution == "my-dist"
    assert info.provides["judges"] == ["constant"]


def test_two_plugins_with_one_name_is_an_error_naming_both_distributions(register_plugin, run_cli):
    register_plugin(judges=[ConstantJudge], name="first", distribution="agenttune-plugin-alpha")
    register_plugin(judges=[OtherConstantJudge], name="second", distribution="agenttune-plugin-beta")
    with pytest.raises(PluginError) as raised:
        get_component("judges", "constant")
    message = str(raised.value)
    assert "Two plugins provide a judge named 'constant'" in message
    assert "agenttune-plugin-alpha" in message and "agenttune-plugin-beta" in message
    assert "AGENTTUNE_DISABLE_PLUGINS" in message
    result = run_cli("plugins", "list")
    assert result.exit_code == 2
    assert "agenttune-plugin-alpha" in result.error and "agenttune-plugin-beta" in result.error


def test_a_class_without_a_name_is_an_error(register_plugin):
    register_plugin(task_readers=[NamelessReader], name="careless", distribution="careless-dist")
    with pytest.raises(PluginError, match="careless.*careless-dist.*NamelessReader without a `name`"):
        get_component("task_readers", "file")


def test_a_broken_hook_marks_the_plugin_broken_and_the_rest_keeps_working(register_plugin, run_cli):
    class HalfBroken:
        @staticmethod
        @hookimpl
        def register_judges():
            return [ConstantJudge]

        @staticmethod
        @hookimpl
        def register_backbones():
            raise ImportError("No module named 'gpu_only_library'")

    register_plugin(HalfBroken(), name="half-broken", distribution="agenttune-plugin-half")
    with pytest.warns(PluginWarning, match="half-broken.*register_backbones raised ImportError"):
        assert get_component("judges", "constant") is ConstantJudge  # its working hook still counts
    result = run_cli("plugins", "list", "--json")
    assert result.exit_code == 0, result.output
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert listed["half-broken"]["judges"] == ["constant"]
    assert "gpu_only_library" in listed["half-broken"]["error"]
    assert "file" in listed["builtins"]["task_readers"]  # other plugins are unaffected
    table = run_cli("plugins", "list")
    assert table.exit_code == 0
    assert "BROKEN" in table.stdout and "gpu_only_library" in table.stdout


def test_unknown_name_mentions_broken_plugins(register_plugin):
    class Broken:
        @staticmethod
        @hookimpl
        def register_backbones():
            raise RuntimeError("cannot start")

    register_plugin(Broken(), name="broken-backbones")
    with pytest.warns(PluginWarning), pytest.raises(PluginError) as raised:
        get_component("backbones", "verl", key="--backbone")
    assert "--backbone: unknown backbone 'verl'" in str(raised.value)
    assert "Installed plugins that failed to load, and so provide nothing:" in str(raised.value)
    assert "broken-backbones ((test)): register_backbones raised RuntimeError: cannot start" in str(raised.value)
    assert raised.value.hint.startswith("If one of them provides it, fix that plugin")


def test_plugins_list_json_shape(run_cli):
    result = run_cli("plugins", "list", "--json")
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)
    builtins = next(entry for entry in entries if entry["name"] == "builtins")
    for key in ("name", "version", "distribution", "task_readers", "agent_frameworks", "judges", "backbones",
                "error"):
        assert key in builtins
    assert builtins["distribution"] == "agenttune"
    assert {"file", "huggingface"} <= set(builtins["task_readers"])


@pytest.mark.filterwarnings("ignore::agenttune.errors.PluginWarning")  # built-ins still being written
def test_trace_prints_every_hook_call_and_its_result(monkeypatch, capsys):
    monkeypatch.setenv("AGENTTUNE_TRACE_PLUGINS", "1")
    manager = PluginManager()  # a fresh manager: tracing is read when it is created
    manager.register(importlib.import_module("agenttune.entrypoints.builtins"), name="builtins", distribution="agenttune")

    class Traced:
        @staticmethod
        @hookimpl
        def register_judges():
            return [ConstantJudge]

    manager.register(Traced(), name="traced", distribution="traced-dist")
    assert manager.get("judges", "constant") is ConstantJudge
    err = capsys.readouterr().err
    assert "[agenttune trace] register_judges() <- traced (traced-dist): [<class" in err
    assert "ConstantJudge" in err
    assert re.search(r"\[agenttune trace\] register_task_readers\(\) <- builtins \(agenttune\): .*FileTaskReader", err)


def test_trace_is_off_by_default(capsys):
    manager = PluginManager()
    manager.register(_judges_plugin(), name="quiet")
    manager.get("judges", "constant")
    assert "[agenttune trace]" not in capsys.readouterr().err


def test_plugins_add_commands_once(register_plugin, run_cli):
    import typer

    calls = []

    def add_commands(app: typer.Typer) -> None:
        calls.append(app)

        @app.command("hello-from-plugin")
        def hello(name: str = typer.Option("world", "--name")) -> None:
            """A command a plugin added."""
            typer.echo(f"hello {name}")

    register_plugin(commands=add_commands, name="greeter")
    first = run_cli("hello-from-plugin", "--name", "agent")
    second = run_cli("hello-from-plugin")
    assert (first.exit_code, first.stdout, second.stdout) == (0, "hello agent\n", "hello world\n")
    assert len(calls) == 1
    from agenttune.entrypoints.cli.main import app

    app.registered_commands[:] = [command for command in app.registered_commands
                                  if command.name != "hello-from-plugin"]  # leave the global app as it was


# -- the hook reference -------------------------------------------------------------------------------------

def hookspec_names() -> list[str]:
    return [name for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
            if hasattr(function, "agenttune_spec")]


def test_every_hookspec_is_documented_in_docs_plugins_md():
    documented = set(re.findall(r"^### `(\w+)\(", DOCS.read_text(encoding="utf-8"), flags=re.MULTILINE))
    names = set(hookspec_names())
    assert names, "no hookspecs found"
    assert names - documented == set(), f"undocumented hooks: {sorted(names - documented)}"
    assert documented - names == set(), f"documented hooks that do not exist: {sorted(documented - names)}"


def test_every_kind_has_a_hook_and_the_docs_signatures_match():
    text = DOCS.read_text(encoding="utf-8")
    for hook_name, _label in KINDS.values():
        assert hook_name in hookspec_names()
    for name in hookspec_names():
        parameters = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert f"### `{name}({parameters})`" in text


# -- helpers ------------------------------------------------------------------------------------------------

def _judges_plugin():
    class Plugin:
        @staticmethod
        @hookimpl
        def register_judges():
            return [ConstantJudge]

    return Plugin()
