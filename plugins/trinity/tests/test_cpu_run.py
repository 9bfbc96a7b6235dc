"""`agenttune train --backbone trinity` on CPU, end to end: Trinity-RFT 0.6.0's own launcher, explorer, buffer,
workflow runners, trainer and synchronizer on a real Ray cluster, in Tinker mode against the `agenttune tinker
serve` the backbone starts (`trinity.model.tinker.enable: true`).

One run of 3 steps, then `--resume` to step 4, through the real CLI in a subprocess; then the server is
started again on the run's Tinker state to check what the run did:
- every sequence Trinity's trainer trained on (the server's `batches.jsonl`) is a sample the engine sampled
  (the rollout log), token for token, with the same loss mask, and every sample was trained on;
- the rewards the judge gave are the rewards in the trainer's batch (its `critic/score/mean`);
- each step explores with the weights of the step before, and they are the trainer's: the log-probs the
  engine reported for step 4's samples (after the resume) are those the trainer's saved state after step 3
  gives the same tokens, not the base model's;
- metrics.jsonl and rollouts/*.jsonl are written; the resumed run trains step 4 only;
- no Ray or server process outlives the run.

Slow (a few minutes on two cores): it starts Ray twice.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import TESTS, VLLM_STUB, calculator_config, write_jsonl

tinker = pytest.importorskip("tinker")

pytestmark = pytest.mark.slow

STEPS = 3
API_KEY = "tml-trinity-cpu-run-check"
TASKS = [{"task_id": f"add-{a}-{b}", "query": f"What is {a} + {b}?", "answer": a + b}
         for a, b in [(40, 2), (5, 6), (7, 8), (12, 30), (9, 9), (21, 4), (3, 14), (18, 7)]]


def cpu_config(data: Path, model_path: Path) -> dict[str, Any]:
    return calculator_config(
        data, model_path, project_name="trinity-cpu",
        judge={"type": "custom", "judge_protocol": "answer_judge:AnswerLengthJudge"},
        rollout={"num_repeat": 4, "max_env_worker": 8, "max_turns": 2, "max_response_length_in_one_turn": 24,
                 "temperature": 1.0},  # temperature 1: the engine's log-probs are the model's own
        # a learning rate at which one LoRA step visibly moves the tiny model's log-probs
        trainer={"total_steps": STEPS, "learning_rate": 1e-2, "seed": 3},
        trinity={"model": {"tinker": {"enable": True, "rank": 8}}})


def without_the_vllm_stub() -> dict[str, str]:
    """The environment of a user's run: the real vLLM modules Trinity imports (the README's CPU install
    line), not the stub conftest.py puts first on the path for the unit tests."""
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path and path != str(VLLM_STUB)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def train(config: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = without_the_vllm_stub()
    command = [sys.executable, "-m", "agenttune", "train", "--conf", str(config), "--backbone", "trinity",
               "--run-dir", str(run_dir), *extra]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"agenttune train exited with {result.returncode}:\n{result.stdout[-4000:]}" \
                                   f"\n{result.stderr[-8000:]}"
    return result


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("trinity-cpu")
    write_jsonl(root / "data" / "train.jsonl", TASKS)
    shutil.copy(TESTS / "answer_judge.py", root / "answer_judge.py")  # the judge, next to the config
    config = root / "trinity_cpu.yaml"
    config.write_text(yaml.safe_dump(cpu_config(root / "data", tiny_model_path)), encoding="utf-8")
    run_dir = root / "run"
    started = time.time()
    first = train(config, run_dir)
    resumed = train(config, run_dir, "--resume", f"trainer.total_steps={STEPS + 1}")
    return run_dir, (started, time.time()), first.stdout + first.stderr + resumed.stdout + resumed.stderr


def rollout_records(run_dir: Path, split: str = "train") -> dict[int, list[dict[str, Any]]]:
    records: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((run_dir / "rollouts").glob(f"step_*_{split}.jsonl")):
        step = int(re.match(r"step_(\d+)_", path.name).group(1))
        records[step] = [json.loads(line) for line in path.read_text().splitlines()]
    return records


def sampled(records: dict[int, list[dict[str, Any]]]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each trainable sample: (its token ids, its loss mask over the response)."""
    return [(tuple(s["prompt_ids"] + s["response_ids"]), tuple(s["loss_mask"]))
            for rows in records.values() for row in rows for s in row["samples"] if s["trainable"]]


def trained(run_dir: Path) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Each datum the trainer sent to forward_backward: (its token ids, its per-token weights).

    Trinity trains through `forward_backward_custom`: the SDK sends cross-entropy whose weights are the
    gradient of Trinity's policy loss per token, so they are 0 wherever that token is not trained on.
    """
    rows = []
    for line in (run_dir / "tinker" / "batches.jsonl").read_text().splitlines():
        for datum in json.loads(line)["datums"]:
            rows.append((tuple(datum["tokens"] + datum["target_tokens"][-1:]), tuple(datum["weights"])))
    return rows


def test_the_run_writes_metrics_and_rollouts_and_resumes_at_the_next_step(cpu_run):
    run_dir, _, output = cpu_run
    records = rollout_records(run_dir)
    assert sorted(records) == [1, 2, 3, 4]  # 3 steps, then the resumed step 4: no step explored twice
    assert all(len(rows) == 2 * 4 for rows in records.values())  # train_batch_size × num_repeat episodes
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trainer_steps = [int(m["step"]) for m in metrics if "actor/pg_loss" in m]
    assert trainer_steps == [1, 2, 3, 4]  # the resumed trainer did not start again at step 1
    assert "Found existing trainer checkpoint" in (
        run_dir / "checkpoints" / "trinity-cpu" / "calc" / "log" / "trainer.log").read_text()
    assert all(math.isfinite(m["actor/pg_loss"]) for m in metrics if "actor/pg_loss" in m)


def test_the_trainer_trains_on_exactly_the_token_ids_the_engine_sampled(cpu_run):
    run_dir, _, _ = cpu_run
    samples = sampled(rollout_records(run_dir))
    assert len(samples) >= (STEPS + 1) * 8
    trained_rows = trained(run_dir)
    assert Counter(tokens for tokens, _ in trained_rows) == Counter(tokens for tokens, _ in samples)
    # a gradient reaches only the model's own tokens: none on the prompt or on tool outputs (loss mask 0)
    masks = {tokens: mask for tokens, mask in samples}
    for tokens, weights in trained_rows:
        mask = masks[tokens]
        assert not any(weights[:-len(mask)]) and not any(w for w, m in zip(weights[-len(mask):], mask, strict=True) if not m)
    assert sum(1 for _, weights in trained_rows if any(weights)) >= 8  # and the loss does train


def test_the_judges_rewards_are_the_rewards_the_trainer_trains_with(cpu_run):
    run_dir, _, _ = cpu_run
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scores = {int(m["step"]): m["critic/score/mean"] for m in metrics if "critic/score/mean" in m}
    rewards_seen = set()
    for step, rows in rollout_records(run_dir).items():
        rewards = [row["reward"] for row in rows for s in row["samples"] if s["trainable"]]
        rewards_seen |= set(rewards)
        assert scores[step] == pytest.approx(sum(rewards) / len(rewards), abs=1e-5)
    assert len(rewards_seen) > 1  # the check compares something: the rewards differ


@pytest.fixture(scope="module")
def restarted_server(cpu_run, tiny_model_path):
    """`agenttune tinker serve` again on the run's Tinker state (its checkpoints outlive the server)."""
    run_dir, _, _ = cpu_run
    log = run_dir.parent / "restarted.log"
    command = [sys.executable, "-m", "agenttune", "tinker", "serve", "--model", str(tiny_model_path), "--port", "0",
               "--state-dir", str(run_dir / "tinker"), "--api-key", API_KEY]
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"Tinker base URL: (http://\S+)", log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield tinker.ServiceClient(base_url=found.group(1), api_key=API_KEY)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def test_the_explorer_samples_from_the_weights_the_trainer_trained(cpu_run, restarted_server, tiny_model_path):
    """The log-probs the engine reported for step 4's samples (the resumed run) are those the trainer's
    weights after step 3 give the same tokens (its saved state, loaded into a new training client), and
    not the base model's: the weights the trainer updates reach the sampler, also across a resume."""
    run_dir, _, _ = cpu_run
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    versions = {int(m["step"]): m["rollout/model_version"] for m in metrics if "rollout/model_version" in m}
    assert [versions[step] for step in (2, 3, 4)] == [1, 2, 3]  # each step explored with the last step's weights
    state = run_dir / "checkpoints" / "trinity-cpu" / "calc" / f"global_step_{STEPS}" / "remote_checkpoint_path.txt"
    trainer_after_step_3 = restarted_server.create_training_client_from_state(state.read_text().strip()).result()
    base = restarted_server.create_sampling_client(base_model=str(tiny_model_path)).result()
    compared = 0
    for row in rollout_records(run_dir)[STEPS + 1]:
        for sample in row["samples"]:
            tokens = sample["prompt_ids"] + sample["response_ids"]
            response = len(sample["response_ids"])
            datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
                                       loss_fn_inputs={"target_tokens": tokens[1:],
                                                       "weights": [1.0] * (len(tokens) - 1)})
            output = trainer_after_step_3.forward([datum], "cross_entropy").result()
            trained_logprobs = output.loss_fn_outputs[0]["logprobs"].tolist()[-response:]
            base_logprobs = base.compute_logprobs(tinker.types.ModelInput.from_ints(tokens)).result()[-response:]
            for engine, trainer_value, mask in zip(sample["logprobs"], trained_logprobs, sample["loss_mask"],
                                                   strict=True):
                if mask:  # the model's own tokens (tool outputs carry no sampling log-prob)
                    assert engine == pytest.approx(trainer_value, abs=2e-3)
                    compared += 1
            assert max(abs(a - b) for a, b in zip(trained_logprobs, base_logprobs, strict=True)) > 1e-2
    assert compared > 50


def test_no_process_outlives_the_run(cpu_run):
    """Neither run leaves a process: not its Tinker server, not a process of its Ray cluster (they all carry
    the run's TINKER_BASE_URL, which the backbone sets before Ray starts)."""
    run_dir, (started, ended), _ = cpu_run
    base_urls = set(re.findall(r"Tinker base URL: (http://\S+)", (run_dir / "tinker" / "server.log").read_text()))
    assert len(base_urls) == 2  # the first run's server, then the resumed run's
    leftovers = []
    for process in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]):
        # this test's own children (the server restarted on the run's state to check it) are not the run's
        if process.info["ppid"] == os.getpid() or not started <= (process.info["create_time"] or 0) <= ended:
            continue
        try:
            environment = process.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        cmdline = " ".join(process.info["cmdline"] or [])
        if environment.get("TINKER_BASE_URL") in base_urls or str(run_dir) in cmdline:
            leftovers.append(f"{process.info['pid']} {cmdline[:120]}")
    assert not leftovers
