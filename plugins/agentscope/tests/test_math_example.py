"""examples/math_agent runs as its README says, through the real `agenttune train` command.

The debug run uses the scripted engine, so the episode is known: the model calls the Python tool,
the sandbox runs the code, the model answers in \\boxed{} and the math judge rewards it. The local
run uses the tiny transformers model and trains one step (its answers are noise; the wiring is real).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import LINE

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "examples" / "math_agent" / "math_agent_smoke.yaml"
WORKFLOW = "math_agent:MathAgentWorkflow" if LINE == 1 else "math_agent_v2:MathAgentWorkflow"


def train(run_dir: Path, backbone: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agenttune", "train", "--conf", str(CONFIG), "--backbone", backbone,
               "--run-dir", str(run_dir), f"workflow={WORKFLOW}", *overrides]
    # From the repository root: the config's data path is relative to it, as the README says.
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_debug_backbone_solves_with_the_python_tool(tmp_path):
    call = "<tool_call>\n" + json.dumps({"name": "execute_python_code",
                                         "arguments": {"code": "print(3 * 4 + 2)"}}) + "\n</tool_call>"
    replies = json.dumps([call, "She spends \\boxed{14} dollars."])

    train(tmp_path, "debug", "engine.type=scripted", f"engine.replies={replies}",
          "debug.first_n_tasks=1", "debug.max_parallel=1")

    [log] = (tmp_path / "rollouts").glob("*.jsonl")
    episodes = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(episodes) == 2  # one task, rollout.num_repeat = 2
    for episode in episodes:
        assert (episode["status"], episode["reward"], episode["success"]) == ("ok", 1.0, True)
        tool_results = [m["content"] for m in episode["messages"] if m["role"] == "tool"]
        assert tool_results == ["<returncode>0</returncode><stdout>14\n</stdout><stderr></stderr>"]
        assert episode["samples"][0]["num_calls"] == 2  # tool call and answer, one merged sample


def test_local_backbone_trains_a_step_on_the_tiny_model(tmp_path):
    train(tmp_path, "local", "rollout.max_response_length_in_one_turn=16", "data.train_batch_size=1")

    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [1]
    assert (tmp_path / "checkpoints").is_dir()
