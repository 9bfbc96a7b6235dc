"""The declared plugin API: what plugins may import from agenttune, and the version they pin.

Every Python file under plugins/ is parsed (the real files, function-level imports included):
plugin code imports agenttune only through `agenttune.plugin_api`; plugin tests may also use the
package root (the user API) and `agenttune.testing`. Every name the API declares resolves, importing
it stays light, and every plugin pins the 0.1 line it was written against.
"""

from __future__ import annotations

import ast
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
PIN = ">=0.1,<0.2"


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
        "import agenttune.config\n"
        "from agenttune.plugin_api import Judge\n"
        "from agenttune import Task\n"
        "def later():\n"
        "    from agenttune.gateway.server import GatewayServer\n"
        "from .sibling import x\n",
        encoding="utf-8",
    )
    found = [problem.split(": ", 1)[1] for problem in violations(plugin_code)]
    assert found == ["imports agenttune.config", "imports agenttune", "imports agenttune.gateway.server"]


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
def test_every_plugin_pins_the_0_1_line(project: Path):
    dependencies = tomllib.loads(project.read_text(encoding="utf-8"))["project"]["dependencies"]
    [requirement] = [Requirement(line) for line in dependencies if Requirement(line).name == "agenttune"]
    assert requirement.specifier == SpecifierSet(PIN), f"{project}: agenttune{requirement.specifier}"
    assert requirement.specifier.contains(Version(agenttune.__version__))  # this agenttune satisfies it
