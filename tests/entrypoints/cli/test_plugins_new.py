"""`agenttune plugins new` (issue 36 item 2): the package it writes passes its own tests and lint.

Every kind alone, all of them together and the default (reader and judge) are generated into a
temporary folder and their tests run in a fresh pytest process from the source tree (the template's
pytest settings put src/ on the path; nothing is installed: nox's `plugin_template` session installs
one and runs it). The `register_plugin` fixture registers the plugin there; a debug run with
debug.yaml goes through the `agenttune` command on the tiny model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agenttune.entrypoints.cli.plugin_template import KINDS

COMBINATIONS = [[kind] for kind in KINDS] + [list(KINDS), []]


def generate(run_cli, tmp_path: Path, name: str, kinds: list[str]) -> Path:
    target = tmp_path / f"agenttune-plugin-{name}"
    result = run_cli("plugins", "new", name, *[f"--kind={kind}" for kind in kinds], "--directory", target)
    assert result.exit_code == 0, result.output
    assert f"Wrote {len(list(target.rglob('*.*')))} files to {target}/" in result.stdout
    return target


def test_the_package_has_a_build_system_and_its_entry_point(run_cli, tmp_path):
    target = generate(run_cli, tmp_path, "countdown", ["reader", "judge"])
    project = tomllib.loads((target / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "hatchling.build"
    assert project["project"]["entry-points"]["agenttune"] == {"countdown": "agenttune_countdown.plugin"}
    assert project["project"]["dependencies"] == ["agenttune>=0.2,<0.3"]
    assert sorted(path.name for path in (target / "src" / "agenttune_countdown").iterdir()) == [
        "__init__.py", "agent.py", "judge.py", "plugin.py", "reader.py"]


def test_a_hyphenated_name_keeps_its_hyphens_in_the_distribution_only(run_cli, tmp_path, monkeypatch):
    """Cookiecutter's convention: `my-env` is the distribution agenttune-plugin-my-env and the package
    agenttune_my_env; the default folder is named after the distribution."""
    monkeypatch.chdir(tmp_path)
    result = run_cli("plugins", "new", "my-env", "--kind=reader", "--kind=judge")
    assert result.exit_code == 0, result.output
    target = tmp_path / "agenttune-plugin-my-env"
    project = tomllib.loads((target / "pyproject.toml").read_text())
    assert project["project"]["name"] == "agenttune-plugin-my-env"
    assert project["project"]["entry-points"]["agenttune"] == {"my_env": "agenttune_my_env.plugin"}
    assert (target / "src" / "agenttune_my_env" / "reader.py").is_file()
    assert "class MyEnvReader" in (target / "src" / "agenttune_my_env" / "reader.py").read_text()


@pytest.mark.parametrize(("name", "kinds", "problem"), [
    ("Bad-Name", ["reader"], "cannot name a plugin"),
    ("my--env", ["reader"], "cannot name a plugin"),
    ("my-env-", ["reader"], "cannot name a plugin"),
    ("fine", ["reader", "loss"], "Unknown plugin kind(s): loss"),
])
def test_bad_names_and_kinds_are_one_paragraph_errors(run_cli, tmp_path, name, kinds, problem):
    result = run_cli("plugins", "new", name, *[f"--kind={kind}" for kind in kinds], "--directory", tmp_path / "x")
    assert result.exit_code == 2 and problem in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()
    again = run_cli("plugins", "new", "fine", "--directory", tmp_path)  # exists already
    assert again.exit_code == 2 and "already exists" in again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kinds", COMBINATIONS, ids=lambda kinds: "+".join(kinds) or "default")
def test_the_generated_plugin_passes_its_own_tests_and_lint(run_cli, tmp_path, kinds):
    name = "_".join(kinds) if len(kinds) == 1 else ("every" if kinds else "plain")
    target = generate(run_cli, tmp_path, f"gen_{name}", kinds)
    environment = {key: value for key, value in os.environ.items() if not key.startswith("AGENTTUNE_")}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=target,
                           capture_output=True, text=True, env=environment, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    expected = 3 + ("reader" in kinds or not kinds) + ("parser" in kinds) + ("backbone" in kinds)
    assert f"{expected} passed" in tests.stdout
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=target,
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout
