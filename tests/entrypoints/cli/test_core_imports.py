"""`agenttune --help` and `agenttune plugins list` stay light: they import every plugin module and call
its hooks, but none of the heavy libraries (checked in a fresh interpreter through sys.modules). So
does `agenttune config check` of a config whose model is a local directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ["torch", "transformers", "peft", "verl", "vllm", "trinity", "ray", "agentscope", "aworld",
         "datasets", "pyarrow", "pandas"]

SCRIPT = """
import json, sys
from agenttune.entrypoints.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"], ["plugins", "list"], ["plugins", "list", "--json"]])
def test_cli_imports_no_heavy_library(args):
    result = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, result.stderr
    imported = {name.split(".")[0] for name in report["modules"]}
    assert "agenttune" in imported
    assert imported & set(HEAVY) == set(), f"`agenttune {' '.join(args)}` imported {sorted(imported & set(HEAVY))}"
    if args[0] == "plugins":
        assert "agenttune.components.readers.file" in report["modules"]  # the hooks really ran
        assert "agenttune.components.readers.huggingface" in report["modules"]


@pytest.mark.slow
def test_config_check_of_a_local_model_imports_no_heavy_library(tiny_model_path):
    valid = Path(__file__).parents[2] / "config" / "bad_configs" / "valid.yaml"  # tiny://default, built above
    result = subprocess.run([sys.executable, "-c", SCRIPT, "config", "check", "--conf", valid.name], cwd=valid.parent,
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, result.stderr
    imported = {name.split(".")[0] for name in report["modules"]}
    assert "agenttune.components.readers.deadline" in report["modules"]  # the tasks were read
    assert "tokenizers" in imported  # the tokenizer was checked, from its tokenizer.json
    assert imported & set(HEAVY) == set(), f"`agenttune config check` imported {sorted(imported & set(HEAVY))}"
