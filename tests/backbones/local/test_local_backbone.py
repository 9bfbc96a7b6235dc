"""The local backbone end to end: real gateway, real `hf` engine sharing the trained tiny model,
real file task reader, a workflow using the OpenAI client. Kept to a few tiny steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

TINY = "tiny://h4-loop?layers=2&hidden=32&heads=2&kv_heads=1&intermediate=64"

WORKFLOW = '''
from agenttune import Judge, JudgeResult, Workflow, WorkflowOutput


class Reply(Workflow):
    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        response = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.query}], max_tokens=12)
        return WorkflowOutput(metadata={"final_answer": response.choices[0].message.content})


class LengthJudge(Judge):
    """Varied, deterministic rewards from random text: enough signal for GRPO to take real steps."""

    def judge(self, judge_input):
        text = judge_input.final_answer or ""
        return JudgeResult(reward=float(len(text) % 3), success=len(text) % 3 == 2)
'''


def write_run_files(tmp_path: Path, **overrides) -> Path:
    (tmp_path / "loop_workflow.py").write_text(WORKFLOW, encoding="utf-8")
    data = tmp_path / "data"
    data.mkdir()
    for split, count in (("train", 6), ("validation", 3)):
        rows = [{"task_id": f"{split}-{i}", "query": f"Say {i}"} for i in range(count)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    config = {
        "workflow": "loop_workflow:Reply",
        "judge": {"judge_protocol": "loop_workflow:LengthJudge"},
        "task_reader": {"type": "file", "path": str(data / "{split}.jsonl"), "validation_split": "validation"},
        "model": {"path": TINY, "max_model_len": 256},
        "rollout": {"num_repeat": 3, "max_env_worker": 1, "max_response_length_in_one_turn": 12},
        "data": {"train_batch_size": 2, "shuffle": True},
        "trainer": {"total_steps": 4, "learning_rate": 1e-2, "test_freq": 2, "val_before_train": True,
                    "save_freq": 2, "seed": 3},
        "local": {"device": "cpu", "micro_batch_tokens": 256},
        "monitor": {"tensorboard": True},
    }
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        config[section][key] = value
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def train(conf: Path, run_dir: Path, *overrides: str, resume: bool = False):
    from agenttune.entrypoints.train import train_from_config
    from agenttune.registry.config_loading import load_config

    return train_from_config(load_config(conf, list(overrides), backbone="local"), run_dir=run_dir, resume=resume)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


@pytest.mark.slow
def test_a_run_writes_metrics_checkpoints_curves_and_rollouts(tmp_path):
    conf = write_run_files(tmp_path)
    run_dir = tmp_path / "run"
    train(conf, run_dir)

    records = read_metrics(run_dir)
    assert [record["step"] for record in records] == [0, 1, 2, 3, 4]
    assert "val/success_rate" in records[0] and "val/success_rate" in records[2] and "val/success_rate" in records[4]
    for record in records[1:]:
        for key in ("reward/mean", "success_rate", "train/samples", "perf/tokens_per_s", "epoch"):
            assert key in record, key
        # the hf engine's share of the step: every generated token took one decode step of its row
        generated = record["tokens/generated_total"]
        assert record["engine/rows_decoded"] == generated > 0 and 0 < record["engine/decode_steps"] <= generated
        assert 0 < record["engine/occupancy"] <= 1 and record["engine/decode_ms_per_step"] > 0
        assert record["engine/graph_steps"] == 0  # (CUDA only)
    # A step whose groups all got equal rewards has nothing to train (GRPO advantages are 0).
    trained = [record for record in records[1:] if record["train/samples"] > 0]
    assert len(trained) >= 2, "fewer than two steps had a reward spread: the test task gives too little signal"
    for record in trained:
        for key in ("train/loss", "train/entropy", "train/grad_norm", "train/logprob_mismatch"):
            assert key in record, key
    # The engine samples from the very model being trained: its logprobs match the trainer's forward
    # pass (same weights, same temperature) up to float noise — also after updates.
    assert all(record["train/logprob_mismatch"] < 1e-3 for record in trained[1:] or trained)
    assert [record["epoch"] for record in records[1:]] == [0, 0, 0, 1]  # 6 tasks, 2 per step
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    assert (run_dir / "training_curves.png").stat().st_size > 10_000
    assert any((run_dir / "tensorboard").iterdir())
    rollout_files = sorted(p.name for p in (run_dir / "rollouts").iterdir())
    assert "step_000000_validation.jsonl" in rollout_files and "step_000004_train.jsonl" in rollout_files


@pytest.mark.slow
def test_resume_continues_exactly_as_an_uninterrupted_run(tmp_path):
    """4 steps in one go == 2 steps, stop, `--resume`, 2 more (episodes run one at a time, so the
    engine's sampling order, and with the restored RNG its samples, are reproducible)."""
    conf = write_run_files(tmp_path)
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    train(conf, straight)
    train(conf, interrupted, "trainer.total_steps=2")
    with pytest.raises(Exception, match="already holds a training run"):
        train(conf, interrupted)  # without --resume the run is not silently overwritten
    train(conf, interrupted, resume=True)

    expected = weights(straight / "checkpoints" / "step_000004" / "model")
    got = weights(interrupted / "checkpoints" / "step_000004" / "model")
    initial = weights(Path(straight / "checkpoints" / "step_000002" / "model"))
    assert any(not torch.equal(initial[name], expected[name]) for name in expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6)
    steps = [record["step"] for record in read_metrics(interrupted)]
    assert steps == [0, 1, 2, 3, 4]  # no duplicated steps after the resume
    rewards = [(r.get("reward/mean"), r.get("val/reward/mean")) for r in read_metrics(straight)]
    assert rewards == [(r.get("reward/mean"), r.get("val/reward/mean")) for r in read_metrics(interrupted)]


@pytest.mark.slow
def test_export_round_trips_a_lora_run(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agenttune.backbones.local.export import export_model

    conf = write_run_files(tmp_path)
    run_dir = tmp_path / "run"
    train(conf, run_dir, "local.lora_rank=4", "trainer.total_steps=2", "trainer.test_freq=0",
          "trainer.val_before_train=false")
    adapter = run_dir / "checkpoints" / "step_000002" / "model"
    assert (adapter / "adapter_model.safetensors").exists()

    out = export_model(run_dir, tmp_path / "exported")
    exported = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert not any("lora" in name for name, _ in exported.named_parameters())

    from peft import PeftModel

    from agenttune.components.engines.model_loading import resolve_model_path

    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY))
    reference = PeftModel.from_pretrained(base, str(adapter)).eval()
    ids = torch.tensor([tokenizer("Say 3")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, reference(ids).logits, rtol=1e-4, atol=1e-5)
        plain = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY))(ids).logits
    assert not torch.allclose(plain, exported(ids).logits), "the export lost the trained adapter"


@pytest.mark.slow
def test_export_and_report_commands(tmp_path, run_cli):
    conf = write_run_files(tmp_path)
    run_dir = tmp_path / "run"
    train(conf, run_dir, "trainer.total_steps=2", "trainer.test_freq=1")
    (run_dir / "training_curves.png").unlink()

    result = run_cli("report", run_dir)
    assert result.exit_code == 0, result.output
    assert "validation accuracy" in result.stdout and (run_dir / "training_curves.png").exists()

    result = run_cli("export", run_dir, "--out", tmp_path / "model", "--step", "1")
    assert result.exit_code == 2 and "no checkpoint of step 1" in result.stderr and "Available steps: 2" in result.stderr
    result = run_cli("export", run_dir, "--out", tmp_path / "model")
    assert result.exit_code == 0, result.output
    assert weights(tmp_path / "model").keys() == weights(run_dir / "checkpoints" / "step_000002" / "model").keys()
    result = run_cli("export", run_dir, "--out", tmp_path / "model")
    assert result.exit_code == 2 and "not empty" in result.stderr


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path, run_cli):
    conf = write_run_files(tmp_path)
    result = run_cli("train", "--conf", conf, "--backbone", "local", "--run-dir", tmp_path / "new", "--resume")
    assert result.exit_code == 2
    assert "no checkpoint" in result.stderr and "--resume" in result.stderr


@pytest.mark.slow
def test_an_engine_with_its_own_weights_sleeps_for_each_update_and_loads_the_new_weights_after(
        tmp_path, register_plugin, monkeypatch):
    """The loop's side of `vllm` colocation, with a real engine that records the two calls."""
    import agenttune.backbones.local as local
    from agenttune.components.engines.hf import HFEngine

    events, versions = [], []

    def fingerprint(model):
        return sum(float(parameter.detach().double().sum()) for parameter in model.parameters())

    class RecordingEngine(HFEngine):
        name = "recording"

        @classmethod
        def from_config(cls, config, options, tokenizer, *, model=None):
            engine = super().from_config(config, options, tokenizer, model=model)
            engine.trained = model
            return engine

        async def release_memory(self):
            events.append(("release", fingerprint(self.trained)))

        async def sync_weights(self, model, version=0):
            assert model is self.trained
            events.append(("sync", fingerprint(model)))
            versions.append(version)

    register_plugin(engines=[RecordingEngine])
    monkeypatch.setattr(local, "SUPPORTED_ENGINES", (*local.SUPPORTED_ENGINES, "recording"))
    conf = write_run_files(tmp_path, trainer__total_steps=2, trainer__test_freq=0, trainer__save_freq=0,
                           trainer__val_before_train=False)
    train(conf, tmp_path / "run", "engine.type=recording")
    # The first sync sets the starting version (an engine with updates_weights records versions per token).
    assert [kind for kind, _ in events] == ["sync", "release", "sync", "release", "sync"] and versions == [0, 1, 2]
    assert events[0][1] == events[1][1]
    updated = [events[i][1] != events[i + 1][1] for i in (1, 3)]  # the optimizer step ran in between
    trained = [record["train/samples"] > 0 for record in read_metrics(tmp_path / "run")]
    assert updated == trained and any(trained), "no step trained: the update went unobserved"
    assert events[2][1] == events[3][1]  # nothing changes the weights between an update and the next rollout
