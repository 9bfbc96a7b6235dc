"""`agenttune train --backbone debug` end to end: the example agent, the table, the rollout log.

The scripted run checks every trained token against what the engine generated; the `hf` run is the
example exactly as its README runs it (a subprocess, the tiny model) and checks the log's masks
against the engine's own token counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agenttune.rollout.log import read_records
from agenttune.testing import tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai_agent"
TOOL_CALL = '<tool_call>\n{"name": "lookup_country", "arguments": {"country": "France"}}\n</tool_call>'
ANSWER = "Paris is the capital."


def runs_of(mask: list[int], ids: list[int]) -> list[tuple[int, list[int]]]:
    """Split ids into maximal runs of equal mask value: [(mask, ids), ...]."""
    runs: list[tuple[int, list[int]]] = []
    for value, token in zip(mask, ids, strict=True):
        if runs and runs[-1][0] == value:
            runs[-1][1].append(token)
        else:
            runs.append((value, [token]))
    return runs


@pytest.fixture
def example_config(write_yaml, tmp_path, monkeypatch):
    """The example's config, pointed at the scripted engine (tool call, then the answer)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return write_yaml({
        "workflow": "facts_agent:FactsWorkflow",
        "task_reader": {"type": "file", "path": str(EXAMPLE / "tasks.jsonl")},
        "judge": {"judge_protocol": "facts_judge:ContainsAnswerJudge"},
        "model": {"path": "tiny://default", "max_model_len": 1024},
        "engine": {"type": "scripted", "replies": [TOOL_CALL, ANSWER]},
        "rollout": {"num_repeat": 2, "max_turns": 3},
        "debug": {"first_n_tasks": 3, "max_parallel": 1},  # one at a time: each episode gets both replies
    })


def test_debug_backbone_logs_exact_samples(run_cli, example_config, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("train", "--conf", example_config, "--backbone", "debug", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output

    for task_id in ("capital-france", "currency-japan", "capital-kenya"):
        assert task_id in result.stdout
    assert "6 episodes" in result.stdout and "reward mean 0.333" in result.stdout

    [log_file] = sorted((run_dir / "rollouts").glob("*.jsonl"))
    assert log_file.name == "step_000001_train.jsonl"
    records = list(read_records(log_file))
    assert [(r.task.task_id, r.repeat_index) for r in records] == [
        ("capital-france", 0), ("capital-france", 1), ("currency-japan", 0), ("currency-japan", 1),
        ("capital-kenya", 0), ("capital-kenya", 1)]
    tokenizer = tiny_tokenizer()
    replies = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
               for text in (TOOL_CALL, ANSWER)]
    for record in records:
        assert (record.status, record.step, record.split) == ("ok", 1, "train")
        assert record.reward == (1.0 if record.task.task_id == "capital-france" else 0.0)
        [sample] = record.samples
        # generated | tool result and template glue | generated: the mask is 1 exactly on the replies
        (first_mask, first), (glue_mask, glue), (last_mask, last) = runs_of(sample.loss_mask, sample.response_ids)
        assert (first_mask, glue_mask, last_mask) == (1, 0, 1)
        assert (first, last) == (replies[0], replies[1])
        assert '"capital": "Paris"' in tokenizer.decode(glue)
        assert sample.response_tokens == [tokenizer.decode([token]) for token in sample.response_ids]
        assert "".join(sample.prompt_tokens).endswith("<|im_start|>assistant\n")

    [metrics] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics["step"] == 1 and metrics["episodes"] == 6
    assert metrics["reward/mean"] == pytest.approx(2 / 6) and metrics["turns/mean"] == 2


def test_debug_backbone_reports_failing_episodes_and_keeps_going(run_cli, example_config, tmp_path):
    # A reply with an unknown tool: the madness check fires on every episode; the run still completes.
    run_dir = tmp_path / "run"
    bad_call = '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'
    result = run_cli("train", "--conf", example_config, "--backbone", "debug", "--run-dir", run_dir,
                     f"engine.replies=[{json.dumps(bad_call)}, {json.dumps(ANSWER)}]",
                     "rollout.agent_madness_reward=-0.5", "rollout.compute_madness_checklist=[wrong_toolcall]")
    assert result.exit_code == 0, result.output
    records = list(read_records(run_dir / "rollouts" / "step_000001_train.jsonl"))
    assert {(r.status, r.reward) for r in records} == {("madness", -0.5)}
    assert "madness" in result.stdout


@pytest.mark.slow
def test_example_command_runs_with_the_tiny_model(tmp_path):
    """The README's command in a fresh process (shorter replies and fewer tasks, to stay quick)."""
    run_dir = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENTTUNE_")}
    done = subprocess.run(
        [sys.executable, "-m", "agenttune", "train", "--conf", "examples/openai_agent/config.yaml",
         "--backbone", "debug", "--run-dir", str(run_dir),
         "debug.first_n_tasks=2", "rollout.max_response_length_in_one_turn=24"],
        cwd=ROOT, env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 episodes" in done.stdout and "capital-france" in done.stdout

    records = list(read_records(run_dir / "rollouts" / "step_000001_train.jsonl"))
    assert len(records) == 4
    tokenizer = tiny_tokenizer()
    for record in records:
        assert record.status in ("ok", "madness"), record.error  # a random model may well talk nonsense
        trained = sum(sum(sample.loss_mask) for sample in record.samples)
        assert trained == record.metrics["generated_tokens"] > 0  # every generated token, nothing else
        for sample in record.samples:
            for value, ids in runs_of(sample.loss_mask, sample.response_ids):
                if value == 0:  # context between calls opens a new turn of the chat template
                    assert "<|im_start|>" in tokenizer.decode(ids)
            assert tokenizer.decode(sample.prompt_ids).startswith("<|im_start|>system\nAnswer the question")
    assert (run_dir / "metrics.jsonl").exists() and (run_dir / "config.yaml").exists()


def test_a_run_resolves_its_components_once(run_cli, example_config, tmp_path, monkeypatch):
    """`preflight` resolves the backbone, reader, workflow, judge and objective; the run carries them to
    the backbone (`Run.components`) instead of the rollout session resolving them all again."""
    from agenttune.registry import resolution

    calls: list[str] = []
    real = resolution.resolve

    def counting(config, **options):
        calls.append(config.backbone)
        return real(config, **options)

    monkeypatch.setattr(resolution, "resolve", counting)
    result = run_cli("train", "--conf", example_config, "--backbone", "debug", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert calls == ["debug"]
