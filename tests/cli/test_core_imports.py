"""`agenttune --help` and `agenttune plugins list` stay light: they import every plugin module and call
its hooks, but none of the heavy libraries (checked in a fresh interpreter through sys.modules)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ["torch", "transformers", "peft", "verl", "vllm", "trinity", "ray", "agentscope", "aworld",
         "datasets", "pyarrow", "pandas"]

SCRIPT = """
import json, sys
from agenttune.cli.main import main
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
        assert "agenttune.readers.file" in report["modules"]  # the hooks really ran
        assert "agenttune.readers.huggingface" in report["modules"]
