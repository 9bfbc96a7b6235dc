"""Shared helpers for the core test suite.

    register_plugin  register a plugin for one test (agenttune.testing.pytest_plugin; plugins' test suites
                     get it through agenttune's `pytest11` entry point)
    run_cli          run `agenttune ARGS...` in-process; returns exit code, stdout and stderr
    write_yaml       write a dict as a YAML config file into tmp_path

The tiny-model fixtures come from agenttune.testing (also a `pytest11` plugin).

Every test runs without the caller's AGENTTUNE_* configuration variables, and with the Hugging Face
libraries offline and caching into a temporary directory: tests never reach the hub.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agenttune.testing.pytest_plugin import register_plugin  # noqa: F401  (also here: works before a reinstall)

# Set before anything imports `datasets` (it reads these once, at import).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_CACHE", str(Path(tempfile.gettempdir()) / "agenttune-tests" / "hf-datasets"))


PLUGIN_VARIABLES = {"AGENTTUNE_LOAD_PLUGINS", "AGENTTUNE_DISABLE_PLUGINS", "AGENTTUNE_TRACE_PLUGINS"}


@pytest.fixture(autouse=True)
def _no_agenttune_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configuration from the caller's environment (AGENTTUNE_<SECTION>..., the plugin switches) must
    not leak into tests; other AGENTTUNE_ variables (AGENTTUNE_CACHE_DIR, ...) stay."""
    from agenttune.config.models import AgentTuneConfig

    sections = {name.upper() for name in AgentTuneConfig.model_fields}
    for name in list(os.environ):
        section = name.removeprefix("AGENTTUNE_").split("__")[0]
        if name in PLUGIN_VARIABLES or (name.startswith("AGENTTUNE_") and section in sections):
            monkeypatch.delenv(name)


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def error(self) -> str:
        """stderr without plugin warnings (built-ins still being written may warn)."""
        return "".join(line for line in self.stderr.splitlines(keepends=True) if not line.startswith("Warning: "))


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """Run the real `agenttune` entry point in this process (plugins registered by the test count)."""
    from agenttune.entrypoints.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")  # wide rich tables: no wrapped cells in assertions

    def run(*args: str) -> CliResult:
        capsys.readouterr()  # drop anything printed before
        try:
            main([str(arg) for arg in args])
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def write_yaml(tmp_path: Path):
    def write(data: dict[str, Any], name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path

    return write
