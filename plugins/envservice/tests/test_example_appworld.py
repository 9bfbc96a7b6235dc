"""examples/appworld: the seeds' AgentScope AppWorld workflow, run for real against the test server.

AppWorld itself cannot run here; `appworld_smoke.yaml` swaps in the test server (same protocol) and a
tiny scripted model. Everything else is what a user runs: the AgentScope 1.x ReActAgent, the
env_service reader and judge, and the launcher starting and stopping the server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentscope", reason="the AppWorld example needs AgentScope (nox -s envservice installs it)")
pytest.importorskip("agenttune_agentscope", reason="the AppWorld example needs agenttune-plugin-agentscope")

from conftest import free_port, server_command  # noqa: E402

from agenttune.plugin_api import load_config, train_from_config  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "appworld"


def test_the_appworld_example_config_is_valid() -> None:
    config = load_config(EXAMPLE / "appworld.yaml", backbone="debug")
    assert config.task_reader.type == "env_service" and config.judge.type == "env_service"
    assert config.section("env_service").url == "http://127.0.0.1:8080"


def test_the_appworld_workflow_runs_end_to_end_against_the_test_server(tmp_path: Path) -> None:
    port = free_port()
    overrides = [f"env_service.url=http://127.0.0.1:{port}",
                 f"env_service.command={json.dumps(server_command(port))}"]
    config = load_config(EXAMPLE / "appworld_smoke.yaml", overrides, backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    records = [json.loads(line) for file in sorted((run.run_dir / "rollouts").glob("*.jsonl"))
               for line in file.read_text().splitlines() if line.strip()]
    assert len(records) == 4
    for record in records:
        assert record["status"] == "ok", record.get("error")
        assert record["output"]["env_steps"] >= 1
        score = record["judge_details"]["env_score"]
        assert record["reward"] == pytest.approx(0.5 * score + (1.0 if score >= 1 else 0.0))
    assert sys.executable  # the server ran under this interpreter (server_command)
