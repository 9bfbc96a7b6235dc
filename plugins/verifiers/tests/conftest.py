"""The verifiers environments the tests write (tests/envs) on sys.path, and agenttune configs that name them.

verifiers imports an environment by its id, in this process and in the tool-server subprocesses it
starts (`python -m <module>`), so the folder goes on sys.path and on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

ENVS = Path(__file__).parent / "envs"
ENVS03 = Path(__file__).parent / "envs03"  # verifiers 0.1-0.3 environments (test_legacy_*.py, nox -s verifiers03)
TINY = "tiny://verifiers?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"


def legacy_stack() -> bool:
    """Whether this Python has verifiers 0.1-0.3 (nox -s verifiers03) rather than 0.4 (nox -s verifiers)."""
    return tuple(int(part) for part in version("verifiers").split(".")[:2]) < (0, 4)


# One nox session per stack: each collects only its own test files (the other stack's environments cannot import).
collect_ignore_glob = [path.name for path in Path(__file__).parent.glob("test_*.py")
                       if path.name.startswith("test_legacy_") != legacy_stack()]


@pytest.fixture(autouse=True)
def test_environments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    envs = ENVS03 if legacy_stack() else ENVS
    monkeypatch.syspath_prepend(str(envs))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(envs), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # verifiers' runtime folders and caches: per test


def config_data(env_id: str, replies: list[str] | None = None, **sections: Any) -> dict[str, Any]:
    """An agenttune config training on the test environment `env_id`, with a scripted (or tiny) model."""
    data: dict[str, Any] = {
        "project_name": "verifiers-test",
        "workflow": "agenttune_verifiers:VerifiersWorkflow",
        "model": {"path": TINY, "max_model_len": 1024},
        "task_reader": {"type": "verifiers", "id": env_id},
        # thread: a judge worker process would import verifiers first (seconds); test_failures checks process isolation
        "judge": {"type": "verifiers", "timeout": 30, "isolation": "thread"},
        "rollout": {"num_repeat": 2, "episode_timeout": 300, "max_response_length_in_one_turn": 48},
        "debug": {"first_n_tasks": 2, "max_parallel": 2},
    }
    if replies is not None:
        data["engine"] = {"type": "scripted", "replies": replies, "cycle": True}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return data


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "verifiers.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def rollout_records(run_dir: Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    files = sorted((run_dir / "rollouts").glob(pattern))
    assert files, f"no rollout log in {run_dir}"
    return [json.loads(line) for file in files for line in file.read_text().splitlines() if line.strip()]


def loss_runs(sample: dict) -> list[list[int]]:
    """The runs of response tokens with loss mask 1: what the trainer trains on, call by call."""
    runs: list[list[int]] = []
    previous = 0
    for token, mask in zip(sample["response_ids"], sample["loss_mask"], strict=True):
        if mask and not previous:
            runs.append([])
        if mask:
            runs[-1].append(token)
        previous = mask
    return runs
