"""The declared plugin API: what plugins may import from agenttune, and the version they pin.

Every Python file under plugins/ is parsed (the real files, function-level imports included):
plugin code imports agenttune only through `agenttune.plugin_api`; plugin tests may also use the
package root (the user API) and `agenttune.testing`. Every name the API declares resolves, importing
it stays light, and every plugin pins the 0.2 line it was written against.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import agenttune
from agenttune import plugin_api

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"
API = "agenttune.plugin_api"
PIN = ">=0.2,<0.3"


def agenttune_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of agenttune or one of its modules in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, module) for module in modules
                  if module == "agenttune" or module.startswith("agenttune.")]
    return found


def allowed(module: str, *, test_code: bool) -> bool:
    if module == API:
        return True
    return test_code and (module == "agenttune" or module == "agenttune.testing"
                          or module.startswith("agenttune.testing."))


def violations(path: Path) -> list[str]:
    test_code = "tests" in path.relative_to(PLUGINS).parts if path.is_relative_to(PLUGINS) else False
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line}: imports {module}"
            for line, module in agenttune_imports(path) if not allowed(module, test_code=test_code)]


def plugin_files() -> list[Path]:
    return sorted(path for path in PLUGINS.rglob("*.py") if ".nox" not in path.parts)


def plugin_projects() -> list[Path]:
    return sorted(PLUGINS.rglob("pyproject.toml"))


def test_every_plugin_imports_agenttune_only_through_the_plugin_api():
    files = plugin_files()
    assert len(files) > 50, f"found only {len(files)} plugin files under {PLUGINS}"
    assert sum(bool(agenttune_imports(path)) for path in files) > 40  # the check sees the imports
    problems = [problem for path in files for problem in violations(path)]
    assert problems == [], (
        "plugins must import agenttune through agenttune.plugin_api (tests may also use `agenttune` "
        "and agenttune.testing):\n" + "\n".join(problems))


def test_the_check_catches_internal_imports(tmp_path):
    plugin_code = tmp_path / "plugin.py"
    plugin_code.write_text(
        "import agenttune.config.models\n"
        "from agenttune.plugin_api import Judge\n"
        "from agenttune import Task\n"
        "def later():\n"
        "    from agenttune.gateway.server import GatewayServer\n"
        "from .sibling import x\n",
        encoding="utf-8",
    )
    found = [problem.split(": ", 1)[1] for problem in violations(plugin_code)]
    assert found == ["imports agenttune.config.models", "imports agenttune", "imports agenttune.gateway.server"]


def test_every_declared_name_resolves_from_where_it_lives():
    for name in plugin_api.__all__:
        module, attribute = plugin_api._WHERE[name]
        value = getattr(plugin_api, name)
        assert value is getattr(sys.modules[module], attribute), name
    with pytest.raises(AttributeError, match="not part of the plugin API"):
        plugin_api.GatewayServer  # noqa: B018


def test_the_type_checking_imports_match_the_runtime_table():
    """Type checkers read the TYPE_CHECKING block, the runtime reads _WHERE: the two must agree."""
    tree = ast.parse(Path(plugin_api.__file__).read_text(encoding="utf-8"))
    [block] = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    typed = {alias.asname or alias.name: (node.module, alias.name)
             for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert typed == plugin_api._WHERE


def test_importing_the_plugin_api_imports_nothing_heavy():
    code = ("import sys, agenttune.plugin_api as api\n"
            "from agenttune.plugin_api import Judge, UserError, hookimpl, TaskReader, Backbone\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'starlette', 'uvicorn', 'openai', 'datasets')"
            " if m in sys.modules)\n"
            "print(','.join(heavy))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("project", plugin_projects(), ids=lambda path: str(path.parent.relative_to(PLUGINS)))
def test_every_plugin_pins_the_release_line(project: Path):
    dependencies = tomllib.loads(project.read_text(encoding="utf-8"))["project"]["dependencies"]
    [requirement] = [Requirement(line) for line in dependencies if Requirement(line).name == "agenttune"]
    assert requirement.specifier == SpecifierSet(PIN), f"{project}: agenttune{requirement.specifier}"
    assert requirement.specifier.contains(Version(agenttune.__version__))  # this agenttune satisfies it


def test_the_plugin_api_version_is_the_release_line():
    """Plugins pin agenttune's release line; PLUGIN_API_VERSION is that line, so a plugin can check it."""
    version = Version(agenttune.__version__)
    assert plugin_api.PLUGIN_API_VERSION == (version.major, version.minor)
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == agenttune.__version__
    assert SpecifierSet(PIN).contains(version)


# 0.1's module paths, and a sample of those 0.2.1 moved (flat modules, a package's submodule, a renamed one).
OLD_MODULES = ["agenttune.task_reader", "agenttune.judge", "agenttune.agent_framework", "agenttune.engine",
               "agenttune.backbone", "agenttune.session", "agenttune.rollout_log", "agenttune.metrics",
               "agenttune.rollout_gc", "agenttune.message_pipe", "agenttune.workflow_processes",
               "agenttune.gateway.ids", "agenttune.gateway.tool_parsers", "agenttune.gateway.reasoning",
               "agenttune.config_loader", "agenttune.tuner", "agenttune.readers.base", "agenttune.cli.main",
               "agenttune.rollout.engine", "agenttune.webserver.limits"]


def test_every_module_that_moved_has_a_shim():
    """The modules git says were renamed away under src/agenttune (the paths plugins of 0.1 imported)."""
    from agenttune.registry import compatibility

    renamed = subprocess.run(["git", "log", "--diff-filter=R", "--name-status", "--format=", "--", "src/agenttune"],
                             cwd=ROOT, capture_output=True, text=True)
    if renamed.returncode != 0 or not renamed.stdout.strip():
        pytest.skip("no git history here")
    old = {line.split("\t")[1] for line in renamed.stdout.splitlines() if line.startswith("R")}
    old = {path for path in old if path.endswith(".py")}  # modules, not package data such as templates
    old_modules = {path.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                   for path in old}
    gone = {module for module in old_modules if not (ROOT / "src" / (module.replace(".", "/") + ".py")).exists()
            and not (ROOT / "src" / module.replace(".", "/")).is_dir()}
    unreleased = {"agenttune.moved"}  # compatibility.py's name while it was written, in no release
    assert gone - unreleased <= set(compatibility.MODULES), gone - unreleased - set(compatibility.MODULES)
    assert set(OLD_MODULES) <= set(compatibility.MODULES)


def test_every_shim_names_a_module_that_exists():
    from agenttune.registry import compatibility

    missing = [new for new, _ in compatibility.MODULES.values() if importlib.util.find_spec(new) is None]
    assert missing == []


@pytest.mark.parametrize("old", OLD_MODULES)
def test_an_old_module_path_imports_with_a_warning_naming_the_plugin_api(old):
    """Each in a fresh interpreter: the first import warns (a plugin of 0.1 loads, and is told)."""
    from agenttune.registry import compatibility

    new = compatibility.MODULES[old][0]
    code = (f"import warnings; warnings.simplefilter('error')\n"
            f"try:\n    import {old}\nexcept DeprecationWarning as warning:\n    print(warning)\n"
            f"warnings.simplefilter('ignore')\n"
            f"import {old} as shim, {new} as new\n"
            f"print(all(getattr(shim, name) is getattr(new, name) for name in dir(new) if not name.startswith('_')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    message, same = result.stdout.strip().splitlines()
    assert message.startswith(f"{old} moved to {new} in agenttune 0.2; the old path works through 0.2.x")
    assert "agenttune.plugin_api" in message and same == "True"
    for name in compatibility.plugin_api_home(new):  # the names it suggests are the plugin API's, from there
        attribute = compatibility.PLUGIN_API[name][1]
        assert f" {name}" in message and getattr(plugin_api, name) is getattr(sys.modules[new], attribute)


def test_the_previous_releases_plugin_code_runs_with_warnings(monkeypatch):
    for old in ("agenttune.task_reader", "agenttune.judge", "agenttune.engine"):  # an earlier test's import of the
        monkeypatch.delitem(sys.modules, old, raising=False)  # old path would already have warned, once
    code = ("from agenttune.task_reader import TaskReader\n"
            "from agenttune.judge import Judge, JudgeResult\n"
            "from agenttune.engine import build_engine, NoOptions\n"  # names that moved on again
            "from agenttune.plugin_api import TaskReader as Now, build_config\n"
            "assert TaskReader is Now and build_engine.__module__ == 'agenttune.registry.resolution'\n")
    with pytest.warns(DeprecationWarning, match="from agenttune.plugin_api import TaskReader"):
        exec(compile(code, "old_plugin.py", "exec"), {})


def test_a_failed_agenttune_import_is_told_where_the_name_lives_now():
    from agenttune.registry.compatibility import import_advice

    with pytest.raises(ImportError) as wrong_module:
        exec("from agenttune.components.judges.base import TaskReader", {})
    assert import_advice(wrong_module.value) == (
        "TaskReader is not in agenttune.components.judges.base: import it from the plugin API, "
        "`from agenttune.plugin_api import TaskReader`.")
    with pytest.raises(ImportError) as internal:
        exec("from agenttune.components.judges.base import NoOptions", {})
    assert "(it lives in agenttune.config.base now), and it is not part of the plugin API" in import_advice(
        internal.value)
    with pytest.raises(ImportError) as no_module:
        exec("import agenttune.components.readers.csv", {})
    assert "agenttune has no module agenttune.components.readers.csv" in import_advice(no_module.value)
    gone = ModuleNotFoundError("No module named 'agenttune.task_reader'", name="agenttune.task_reader")
    assert import_advice(gone) == ("agenttune.task_reader moved to agenttune.components.readers.base in agenttune 0.2: import "
                                   "from the plugin API instead, `from agenttune.plugin_api import TaskReader` "
                                   "(docs/plugins.md).")
    assert import_advice(ModuleNotFoundError("No module named 'torch'", name="torch")) is None
