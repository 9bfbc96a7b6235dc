"""Shared pieces of the verl plugin's tests.

Everything is real except what needs a GPU: verl's own config files, dataset class, agent-loop
workers and `AgentLoopOutput` validation run as they do in a training job; only the vLLM rollout
server behind verl's `server_manager` is replaced by `FakeServerManager`, which answers with
scripted text tokenized by the tiny model's real tokenizer.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from agenttune_verl.launch import CONFIG_NAME, verl_dir

from agenttune.plugin_api import AgentTuneConfig, load_config

AGENTS_DIR = Path(__file__).parent / "agents"
CALCULATOR = "agenttune.testing.agents:CalculatorWorkflow"
TOOL_CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
FINAL_ANSWER = "The answer is 5."


def fake_logprob(token_id: int) -> float:
    return -((token_id % 89) + 1) / 100


class FakeServerManager:
    """Stands in for verl's `LLMServerClient` (whose vLLM servers need GPUs).

    Replies to the n-th call of each request id with `replies[n]` (cycling), tokenized by the real
    tokenizer and ended with `<|im_end|>`, as vLLM returns a completed generation. Records every call.
    """

    def __init__(self, tokenizer: Any, replies: list[str], *, global_steps: int = 3):
        self.tokenizer = tokenizer
        self.replies = replies
        self.global_steps = global_steps
        self.calls: list[dict[str, Any]] = []
        self._per_request: dict[str, int] = defaultdict(int)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        index = self._per_request[request_id]
        self._per_request[request_id] += 1
        text = self.replies[index % len(self.replies)]
        token_ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                           "sampling_params": dict(sampling_params), "token_ids": token_ids})
        return TokenOutput(token_ids=token_ids, log_probs=[fake_logprob(t) for t in token_ids],
                           stop_reason="completed", num_preempted=0,
                           extra_fields={"global_steps": self.global_steps, "min_global_steps": self.global_steps,
                                         "max_global_steps": self.global_steps})


def load_like_main_ppo(run: Any) -> Any:
    """The config as `python -m verl.trainer.main_ppo --config-path D --config-name N` composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_dir(run)), version_base=None):
        config = compose(config_name=CONFIG_NAME)
    GlobalHydra.instance().clear()
    return config


def write_tasks_file(directory: Path, split: str, count: int) -> Path:
    path = directory / f"{split}.jsonl"
    rows = [{"task_id": f"{split}-{i}", "question": f"What is 2 + 3? (#{i})", "answer": "5",
             "meta": {"level": i, "tags": ["add"]}} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def agent_config(tmp_path: Path, tiny_model_path: Path) -> Any:
    """Build an agenttune config for the calculator agent on the tiny model (a real model directory)."""

    def build(*overrides: str, workflow: str = CALCULATOR) -> AgentTuneConfig:
        write_tasks_file(tmp_path, "train", 4)
        write_tasks_file(tmp_path, "test", 2)
        conf = tmp_path / "agent.yaml"
        conf.write_text(json.dumps({
            "project_name": "verltest",
            "experiment_name": "calc",
            "backbone": "verl",
            "workflow": workflow,
            "judge": {"type": "custom", "judge_protocol": "verl_agents:AnswerJudge"},
            "model": {"path": str(tiny_model_path), "max_model_len": 1024},
            "task_reader": {"type": "file", "path": str(tmp_path / "{split}.jsonl"), "query_column": "question",
                            "ground_truth_column": "answer", "validation_split": "test"},
            "rollout": {"num_repeat": 2, "max_env_worker": 4, "max_response_length_in_one_turn": 64},
            "data": {"train_batch_size": 2, "max_prompt_length": 256, "max_response_length": 512},
            "trainer": {"n_gpus_per_node": 1, "nnodes": 1, "test_freq": 1},
            "monitor": {"tensorboard": False},
        }), encoding="utf-8")
        config = load_config(conf, list(overrides))
        config._source_dir = AGENTS_DIR  # the test agents' module lives in tests/agents
        return config

    return build
