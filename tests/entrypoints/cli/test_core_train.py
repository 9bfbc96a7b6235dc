"""`agenttune train`: every component is checked before any work, then the run directory is made and
the backbone runs in it. The backbone and agent framework here are throwaway ones registered for the
test (the real debug/local backbones have their own tests)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
import yaml

from agenttune.components.backbone import Backbone
from agenttune.components.frameworks.base import AgentFramework
from agenttune.config.run import Run
from agenttune.errors import UserError


class RecordingBackbone(Backbone):
    name = "recording"
    runs: list[Run] = []

    def run(self, run: Run) -> None:
        tasks = list(run_reader(run).read(run.config.task_reader.train_split))
        (run.run_dir / "tasks.json").write_text(json.dumps([task.query for task in tasks]), encoding="utf-8")
        RecordingBackbone.runs.append(run)


class PickyBackbone(Backbone):
    name = "picky"

    @classmethod
    def check(cls, config) -> None:
        if not config.model.path:
            raise UserError("The picky backbone needs model.path.", hint="Set model.path.")


class PlainFramework(AgentFramework):
    name = "plain"


def run_reader(run: Run):
    from agenttune.registry.resolution import resolve_task_reader

    return resolve_task_reader(run.config)


@pytest.fixture
def project(tmp_path, write_yaml, register_plugin):
    """A config, a workflow module next to it and a task file; returns a function that writes the YAML."""
    register_plugin(backbones=[RecordingBackbone, PickyBackbone], agent_frameworks=[PlainFramework],
                    distribution="agenttune-test-components")
    RecordingBackbone.runs.clear()
    module = f"workflow_{uuid.uuid4().hex[:8]}"  # unique: imported modules are cached per process
    (tmp_path / f"{module}.py").write_text(
        "from agenttune import Workflow, WorkflowOutput\n\n"
        "class EchoWorkflow(Workflow):\n"
        "    async def execute(self, task, tuner):\n"
        "        return WorkflowOutput(reward=1.0)\n\n"
        "NOT_A_CLASS = 3\n",
        encoding="utf-8",
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"query": "first"}\n{"query": "second"}\n', encoding="utf-8")

    def write(**changes):
        data = {"project_name": "demo", "experiment_name": "exp1", "backbone": "recording",
                "agent_framework": "plain", "workflow": f"{module}:EchoWorkflow",
                "task_reader": {"type": "file", "path": str(tasks)}}
        data.update(changes)
        return write_yaml(data)

    write.module = module
    return write


def test_train_creates_the_run_directory_and_hands_over_to_the_backbone(run_cli, project, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("train", "--conf", project(), "--run-dir", run_dir, "rollout.num_repeat=2")
    assert result.exit_code == 0, result.output
    (run,) = RecordingBackbone.runs
    assert run.run_dir == run_dir
    assert json.loads((run_dir / "tasks.json").read_text()) == ["first", "second"]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["rollout"]["num_repeat"] == 2 and saved["backbone"] == "recording"
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert any(record["event"] == "run started" and record["backbone"] == "recording" for record in log)
    assert (run_dir / "rollouts").is_dir()


def test_default_run_directory_is_under_runs_project_experiment(run_cli, project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli("train", "--conf", project())
    assert result.exit_code == 0, result.output
    (run,) = RecordingBackbone.runs
    assert run.run_dir.parent == Path("runs") / "demo" / "exp1"
    assert (tmp_path / run.run_dir / "config.yaml").exists()


def test_backbone_and_agent_flags_override_the_config(run_cli, project, tmp_path):
    conf = project(backbone="nope", agent_framework="nope")
    result = run_cli("train", f"--conf={conf}", "--backbone", "recording", "--agent", "plain",
                     "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert RecordingBackbone.runs[0].config.backbone == "recording"


@pytest.mark.parametrize(("changes", "expected"), [
    ({"backbone": "recordng"}, r"backbone: unknown backbone 'recordng'. Available: .*recording"),
    ({"agent_framework": "agentscop"}, r"agent_framework: unknown agent framework 'agentscop'. Available: .*plain"),
    ({"task_reader": {"type": "csv"}}, r"task_reader.type: unknown task reader 'csv'. Available: .*file.*huggingface"),
    ({"task_reader": {"type": "file", "path": "missing.jsonl"}}, r"task_reader.path: 'missing.jsonl' does not exist"),
    ({"workflow": "no_such_module:EchoWorkflow"}, r"workflow: cannot import module 'no_such_module'"),
    ({"workflow": "{module}:EchoWorkflw"}, r"workflow: module '\w+' has no attribute 'EchoWorkflw'.*EchoWorkflow"),
    ({"workflow": "{module}:NOT_A_CLASS"}, r"is not a Workflow class"),
    ({"workflow": "just_a_name"}, r"'just_a_name' is not a code reference.*package.module:Name"),
    ({"workflow": None}, r"workflow is not set"),
    ({"judge": {"type": "custom"}}, r"judge.type is 'custom' but judge.judge_protocol is not set"),
    ({"judge": {"judge_protocol": "{module}:EchoWorkflow"}}, r"is not a Judge class"),
    ({"backbone": "picky"}, r"The picky backbone needs model.path. Set model.path."),
])
def test_every_component_is_checked_before_the_run_directory_exists(run_cli, project, tmp_path, changes, expected):
    changes = json.loads(json.dumps(changes).replace("{module}", project.module))
    run_dir = tmp_path / "run"
    result = run_cli("train", "--conf", project(**changes), "--run-dir", run_dir)
    assert result.exit_code == 2, result.output
    assert result.error.startswith("Error: ") and result.error.count("\n") == 1  # one paragraph
    assert "Traceback" not in result.output
    assert re.search(expected, result.error), result.error
    assert not run_dir.exists()
    assert RecordingBackbone.runs == []


def test_a_workflow_module_that_raises_on_import_is_a_user_error(run_cli, project, tmp_path):
    (tmp_path / "exploding.py").write_text("raise RuntimeError('boom at import')\n", encoding="utf-8")
    result = run_cli("train", "--conf", project(workflow="exploding:Anything"), "--run-dir", tmp_path / "run")
    assert result.exit_code == 2
    assert "workflow: importing 'exploding' raised RuntimeError: boom at import" in result.stderr


def test_a_user_error_raised_on_import_keeps_its_own_hint(run_cli, project, tmp_path):
    # What examples/math_agent/math_agent.py raises when no supported AgentScope line is installed.
    (tmp_path / "versioned.py").write_text(
        "from agenttune.errors import UserError\n"
        "raise UserError('agentscope 3.0.0 is installed, but only 1.x and 2.x are supported.', "
        "hint='Install agentscope==2.0.10.')\n", encoding="utf-8")
    result = run_cli("train", "--conf", project(workflow="versioned:Anything"), "--run-dir", tmp_path / "run")
    assert result.exit_code == 2
    assert result.error.count("\n") == 1  # one paragraph
    assert ("workflow: importing 'versioned': agentscope 3.0.0 is installed, but only 1.x and 2.x are "
            "supported. Install agentscope==2.0.10.") in result.error
    assert "Fix the error in that module" not in result.error
