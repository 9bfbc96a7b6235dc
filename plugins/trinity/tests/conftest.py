"""Shared set-up for the trinity plugin's CPU tests.

vLLM cannot be installed here, and Trinity-RFT 0.6.0 imports it at module level in the modules that
define `ModelWrapper` and the explorer; `vllm_stub/` provides exactly the names imported there (and
nothing that works). It goes first on the import path, also for subprocesses the tests start.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent
VLLM_STUB = TESTS / "vllm_stub"
sys.path.insert(0, str(VLLM_STUB))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(VLLM_STUB), os.environ.get("PYTHONPATH")]))

TASKS = [
    {"task_id": "add-1", "query": "What is 40 + 2?", "answer": 42, "source": {"book": "arithmetic", "page": 1}},
    {"task_id": "add-2", "query": "What is 5 + 6?", "answer": 11, "difficulty": "easy"},
    {"task_id": "add-3", "query": "What is 7 + 8?", "answer": 15, "hints": ["carry the one"]},
]
VALIDATION_TASKS = [{"task_id": "val-1", "query": "What is 1 + 1?", "answer": 2}]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", TASKS)
    write_jsonl(data / "validation.jsonl", VALIDATION_TASKS)
    return data


def calculator_config(data_dir: Path, model_path: Path, **sections: Any) -> dict[str, Any]:
    """The config of the calculator agent (agenttune.testing.agents) on the tiny model, as YAML would hold
    it; `sections` replace whole top-level sections."""
    return {
        "project_name": "trinity-test",
        "experiment_name": "calc",
        "backbone": "trinity",
        "workflow": "agenttune.testing.agents:CalculatorWorkflow",
        "task_reader": {"type": "file", "path": str(data_dir), "train_split": "train"},
        "judge": {"type": "custom", "judge_protocol": "answer_judge:ExactAnswerJudge"},
        "model": {"path": str(model_path), "max_model_len": 1024},
        "rollout": {"num_repeat": 2, "max_env_worker": 4, "max_response_length_in_one_turn": 96,
                    "temperature": 0.9},
        "data": {"train_batch_size": 2},
        "trainer": {"n_gpus_per_node": 4, "learning_rate": 2e-6},
        **sections,
    }


@pytest.fixture
def make_config(data_dir: Path, tiny_model_path: Path):
    """An agenttune config for the calculator agent, with overrides."""
    from agenttune.plugin_api import apply_overrides, build_config

    def make(*overrides: str, **sections: Any) -> Any:
        data = calculator_config(data_dir, tiny_model_path, **sections)
        config = build_config(data, apply_overrides({}, list(overrides)), source="test config")
        config._source_dir = TESTS
        return config

    return make
