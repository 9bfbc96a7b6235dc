"""The example written for the other AgentScope line: one paragraph naming the extra to install.

`pip install -e plugins/agentscope` without an extra installs the newest AgentScope (2.x); the seeds'
examples are 1.x code (`ReActAgent`). The math example picks its line itself (`math_agent.py`), but a
config that names one line's file (`math_agent_v1.py`, `math_agent_v2.py`) with the other installed
must say which extra installs the right one, not end in a bare `cannot import name 'ReActAgent'`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from conftest import LINE

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "examples" / "math_agent" / "math_agent_smoke.yaml"
PLUGIN = REPO / "plugins" / "agentscope"
# The example's workflow for the line that is NOT installed, and the extra that installs that line.
OTHER_WORKFLOW, OTHER_EXTRA = ("math_agent_v2:MathAgentWorkflow", "agentscope2") if LINE == 1 else \
    ("math_agent_v1:MathAgentWorkflow", "agentscope1")


def test_the_other_lines_example_names_the_extra_that_installs_its_line(tmp_path):
    command = [sys.executable, "-m", "agenttune", "train", "--conf", str(CONFIG), "--backbone", "debug",
               "--run-dir", str(tmp_path / "run"), f"workflow={OTHER_WORKFLOW}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "500"})  # wide: no path folded in two
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    paragraph = " ".join(output.split())  # (rich wraps long lines)
    assert "ImportError: cannot import name" in paragraph
    assert f"agentscope {version('agentscope')} is installed" in paragraph
    assert f"pip install -e '{PLUGIN}[{OTHER_EXTRA}]'" in paragraph
