"""`agenttune train --backbone verl` on this CPU machine, through verl's own trainer (`verl.trainer.device=cpu`).

Two real runs of the calculator agent on the tiny model, as a user types them: three steps, then `--resume` to a
fourth. Everything is verl's and agenttune's own code: `verl.trainer.main_ppo` and its V1 trainer on a local
Ray head, FSDP2 on gloo, verl's dataloader and agent-loop workers running the agenttune agent loop, agenttune's
`hf` engine as the rollout server, verl's naive checkpoint engine and its checkpoints. A recording probe
(agents/verl_probe.py), which verl itself loads in each of its processes, writes down what the engine sampled
and what verl's actor trained on; the tests compare those, the checkpoints and the run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import AGENTS_DIR, CALCULATOR

# Both runs happen in the module's fixture, on the first test's clock: about five minutes on 2 cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS_FIRST, STEPS_TOTAL = 3, 4
LOGPROB_TOLERANCE = 1e-3  # float32 on both sides; verl reports ~5e-5 between the engine and its actor


@dataclass
class Phase:
    output: str
    probe: Path
    leftovers: list[str]

    def records(self, kind: str) -> list[dict[str, Any]]:
        return [json.loads(line) for path in sorted(self.probe.glob(f"{kind}-*.jsonl"))
                for line in path.read_text().splitlines()]

    def trained_samples(self) -> list[dict[str, Any]]:
        """One dict per sample of every batch the actor trained on (prompts, responses, response_mask, ...)."""
        samples = []
        for batch in self.records("trained"):
            fields = batch["fields"]
            samples += [{name: rows[index] for name, rows in fields.items()} for index in range(len(fields["prompts"]))]
        return samples


@dataclass
class CpuRun:
    run_dir: Path
    model_path: Path
    first: Phase
    resumed: Phase


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> CpuRun:
    root = tmp_path_factory.mktemp("cpu_run")
    conf = write_config(root, tiny_model_path)
    run_dir = root / "run"
    first = train(conf, run_dir, root / "probe-first", f"trainer.total_steps={STEPS_FIRST}")
    resumed = train(conf, run_dir, root / "probe-resumed", "--resume", f"trainer.total_steps={STEPS_TOTAL}")
    return CpuRun(run_dir, tiny_model_path, first, resumed)


def write_config(root: Path, model_path: Path) -> Path:
    rows = [{"task_id": f"train-{i}", "question": f"What is 2 + {i}?", "answer": str(2 + i)} for i in range(8)]
    (root / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    conf = root / "calc.yaml"
    conf.write_text(yaml.safe_dump({
        "project_name": "verlcpu", "experiment_name": "calc", "backbone": "verl", "workflow": CALCULATOR,
        # rewards that differ between episodes, so that every step moves the weights
        "judge": {"type": "custom", "judge_protocol": "verl_agents:ShortAnswerJudge"},
        "model": {"path": str(model_path), "max_model_len": 1024},
        "task_reader": {"type": "file", "path": str(root / "{split}.jsonl"), "query_column": "question",
                        "ground_truth_column": "answer"},
        "rollout": {"num_repeat": 2, "max_env_worker": 4, "max_turns": 2, "max_response_length_in_one_turn": 24},
        "data": {"train_batch_size": 2, "max_prompt_length": 512, "max_response_length": 256},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1, "test_freq": 0, "save_freq": 1, "learning_rate": 1e-3},
        "monitor": {"tensorboard": False},
        "verl": {"trainer.device": "cpu"},
    }), encoding="utf-8")
    return conf


def train(conf: Path, run_dir: Path, probe: Path, *args: str) -> Phase:
    probe.mkdir()
    marker = uuid.uuid4().hex  # in the environment of every process of this run, Ray's and verl's included
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(AGENTS_DIR), os.environ.get("PYTHONPATH", "")]),
           "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0", "CPU_RUN_MARKER": marker,
           "VERL_USE_EXTERNAL_MODULES": "verl_probe", "VERL_PROBE_DIR": str(probe)}
    result = subprocess.run([sys.executable, "-m", "agenttune", "train", "--conf", str(conf), "--backbone", "verl",
                             "--run-dir", str(run_dir), *args], capture_output=True, text=True, env=env,
                            timeout=420)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    return Phase(output, probe, leftovers(marker))


def leftovers(marker: str) -> list[str]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "name"]):
        try:
            if process.environ().get("CPU_RUN_MARKER") == marker:
                found.append(f"{process.pid} {process.name()}")
        except psutil.Error:
            continue
    return found


def test_verls_trainer_runs_the_steps_and_resumes_at_the_next_one(cpu_run):
    steps = [record["step"] for record in map(json.loads, (cpu_run.run_dir / "metrics.jsonl").open())]
    assert steps == list(range(1, STEPS_TOTAL + 1))
    for step in range(1, STEPS_TOTAL + 1):
        assert (cpu_run.run_dir / "rollouts" / f"step_{step:06d}_train.jsonl").is_file()
        assert (cpu_run.run_dir / "checkpoints" / f"global_step_{step}").is_dir()
    # the actor trained three batches, then one after resuming from global_step_3
    assert len(cpu_run.first.records("trained")) == STEPS_FIRST
    assert len(cpu_run.resumed.records("trained")) == STEPS_TOTAL - STEPS_FIRST
    assert f"global_step_{STEPS_FIRST}" in cpu_run.resumed.output


def test_every_trained_token_is_a_token_the_engine_sampled_there(cpu_run):
    for phase in (cpu_run.first, cpu_run.resumed):
        generations = phase.records("sampled")
        used = set()
        for sample in phase.trained_samples():
            sequence = sample["prompts"] + sample["responses"]
            sampled_at = {}  # position in the sequence -> (generation, index in it)
            for number, generation in enumerate(generations):
                start = len(generation["prompt_ids"])
                if sequence[:start] == generation["prompt_ids"] and \
                        sequence[start:start + len(generation["token_ids"])] == generation["token_ids"]:
                    used.add(number)
                    sampled_at.update({start + i: (generation, i) for i in range(len(generation["token_ids"]))})
            offset = len(sample["prompts"])
            trained = {offset + i for i, mask in enumerate(sample["response_mask"]) if mask}
            assert trained and trained == set(sampled_at)
            for position in trained:  # and verl keeps the engine's sampling logprobs for them
                generation, index = sampled_at[position]
                rollout = sample["rollout_log_probs"][position - offset]
                assert rollout == pytest.approx(generation["log_probs"][index], abs=1e-6)
        assert used == set(range(len(generations)))  # every generation of a training step was trained


def test_the_judges_rewards_reach_the_trainer_batch(cpu_run):
    rewards = {}
    for path in (cpu_run.run_dir / "rollouts").glob("step_*_train.jsonl"):
        for episode in map(json.loads, path.open()):
            for sample in episode["samples"]:
                rewards[tuple(sample["prompt_ids"] + sample["response_ids"])] = episode["reward"]
    samples = cpu_run.first.trained_samples() + cpu_run.resumed.trained_samples()
    assert len(samples) == STEPS_TOTAL * 4
    for sample in samples:
        reward = rewards[tuple(sample["prompts"] + sample["responses"])]
        assert sum(sample["rm_scores"]) == pytest.approx(reward, abs=1e-6)
    assert len({round(sum(sample["rm_scores"]), 6) for sample in samples}) > 1  # GRPO had a signal


def test_the_rollout_server_samples_with_the_weights_the_trainer_saved(cpu_run):
    """After step 1 (and after resuming from step 3) the served policy scores its samples exactly as the
    trainer's weights of that step do, and not as the weights before it: verl's checkpoint engine delivered."""
    for phase, step in ((cpu_run.first, 1), (cpu_run.resumed, STEPS_FIRST)):
        generations = [g for g in phase.records("sampled") if g["policy_version"] == step]
        assert generations
        after = token_logprobs(cpu_run.model_path, trainer_weights(cpu_run.run_dir, step), generations)
        before = token_logprobs(cpu_run.model_path, trainer_weights(cpu_run.run_dir, step - 1), generations)
        served = [logprob for generation in generations for logprob in generation["log_probs"]]
        assert max_difference(served, after) < LOGPROB_TOLERANCE
        assert max_difference(served, before) > 10 * LOGPROB_TOLERANCE  # the check can tell the steps apart
    metrics = [json.loads(line) for line in (cpu_run.run_dir / "metrics.jsonl").open()]
    assert all(record["verl/training/rollout_probs_diff_max"] < LOGPROB_TOLERANCE for record in metrics)


def test_no_process_is_left_behind(cpu_run):
    for phase in (cpu_run.first, cpu_run.resumed):
        assert phase.leftovers == []
        assert "still running at its end" not in phase.output


def trainer_weights(run_dir: Path, step: int) -> dict[str, Any] | None:
    """The actor's weights in verl's checkpoint of `step` (one rank: its shards are whole); None: the initial ones."""
    import torch

    if step == 0:
        return None
    path = run_dir / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {name: tensor.to_local() if hasattr(tensor, "to_local") else tensor for name, tensor in state.items()}


def token_logprobs(model_path: Path, weights: dict[str, Any] | None, generations: list[dict[str, Any]]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    scores = []
    with torch.no_grad():
        for generation in generations:
            ids = generation["prompt_ids"] + generation["token_ids"]
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
            logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
            scores += logprobs[len(generation["prompt_ids"]) - 1:].tolist()
    return scores


def max_difference(first: list[float], second: list[float]) -> float:
    assert len(first) == len(second)
    return max(abs(a - b) for a, b in zip(first, second, strict=True))
