"""Step metrics, metrics.jsonl and the rollout log (schema, token text, round trip)."""

from __future__ import annotations

import json
import math

import pytest

from agenttune.config.run import Run
from agenttune.rollout.log import LoggedSample, RolloutLog, RolloutRecord, read_records
from agenttune.rollout.metrics import MetricsLog, step_metrics, zero_variance_fraction
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import tiny_config
from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
from agenttune.workflow.task import Task


def sample(response: list[int], mask: list[int], *, agent: str = "default", trainable: bool = True) -> Sample:
    return Sample(agent=agent, prompt_ids=[1, 2, 3], response_ids=response, loss_mask=mask,
                  logprobs=[-0.5 if m else 0.0 for m in mask], trainable=trainable)


def episode(group: str, reward: float, *, status: EpisodeStatus = EpisodeStatus.OK, success: bool = False,
            samples: list[Sample] = (), **metrics: float) -> Episode:
    return Episode(episode_id=f"{group}-{reward}-{status.value}", task=Task(task_id=group, query="q"),
                   group_id=group, status=status, reward=reward, success=success, samples=list(samples),
                   metrics={key.replace("__", "/"): value for key, value in metrics.items()})


def step() -> list[Episode]:
    """Two groups: g1 has rewards 1, 0 (variance), g2 has 0.5, 0.5 (none); one madness, one timeout."""
    return [
        episode("g1", 1.0, success=True, calls=3, prompt_tokens=100, generated_tokens=30, merge_break__tools=1,
                samples=[sample([5, 6, 7, 8], [1, 1, 0, 1]), sample([9], [1], agent="critic", trainable=False)]),
        episode("g1", 0.0, status=EpisodeStatus.TIMEOUT, calls=1, prompt_tokens=50, generated_tokens=10,
                context_overflow=1),
        episode("g2", 0.5, status=EpisodeStatus.MADNESS, calls=2, prompt_tokens=80, generated_tokens=20,
                merge_break__tools=2, merge_break__system=1, samples=[sample([5, 6], [1, 1])]),
        episode("g2", 0.5, success=True, calls=2, prompt_tokens=70, generated_tokens=40, samples=[sample([1], [1])]),
    ]


def test_step_metrics_by_hand():
    metrics = step_metrics(step())
    assert metrics["episodes"] == 4
    assert metrics["reward/mean"] == pytest.approx(0.5)
    assert metrics["reward/std"] == pytest.approx(math.sqrt((0.25 + 0.25 + 0 + 0) / 4))
    assert (metrics["reward/min"], metrics["reward/max"]) == (0.0, 1.0)
    assert metrics["success_rate"] == 0.5
    assert (metrics["turns/mean"], metrics["turns/max"]) == (2.0, 3.0)
    assert metrics["overflow_rate"] == 0.25
    assert metrics["madness_rate"] == 0.25
    assert metrics["failure_rate"] == 0.25  # madness is not a failure: the episode is trained, penalised
    assert metrics["failures/timeout"] == 1 and metrics["failures/workflow_error"] == 0
    assert metrics["groups/zero_variance_frac"] == 0.5
    assert metrics["samples/per_episode"] == pytest.approx(4 / 4)
    assert metrics["tokens/prompt_total"] == 300 and metrics["tokens/generated_total"] == 100
    assert metrics["tokens/generated_mean"] == 25
    assert metrics["tokens/trained_total"] == 3 + 2 + 1  # the critic's sample is not trainable
    assert metrics["merge_breaks/total"] == 4
    assert (metrics["merge_breaks/tools"], metrics["merge_breaks/system"]) == (3, 1)


def test_step_metrics_prefix_and_empty_steps():
    assert set(step_metrics(step(), prefix="val/")) == {f"val/{name}" for name in step_metrics(step())}
    assert step_metrics([]) == {"episodes": 0.0}


def test_zero_variance_counts_groups_not_episodes():
    episodes = [episode("a", 1.0), episode("a", 1.0), episode("a", 1.0), episode("b", 0.0), episode("b", 1.0)]
    assert zero_variance_fraction(episodes) == 0.5


def test_metrics_log_writes_one_json_object_per_step(tmp_path):
    log = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    assert log.read() == []
    log.write(1, {"reward/mean": 0.25, "kl": float("nan")})
    log.write(2, {"reward/mean": 0.5, "kl": 0.1})
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    first, second = log.read()
    assert first["kl"] is None and second["kl"] == 0.1 and second["reward/mean"] == 0.5
    assert "NaN" not in lines[0]  # strict JSON readers (browsers) must parse every line


def test_rollout_log_round_trips_with_token_text(tmp_path):
    tokenizer = tiny_tokenizer()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    reply = tokenizer.encode("Héllo, wörld!", add_special_tokens=False) + [tokenizer.eos_token_id]
    logged = Episode(episode_id="e1", task=Task(task_id="t1", query="Hi there", metadata={"ground_truth": 1}),
                     group_id="g", reward=1.0, success=True, messages=[{"role": "user", "content": "Hi there"}],
                     samples=[Sample(prompt_ids=prompt, response_ids=reply, loss_mask=[1] * len(reply),
                                     logprobs=[-0.1] * len(reply))],
                     metrics={"calls": 1.0}, started_at=123.0, duration_s=0.5)
    run = Run(config=tiny_config(), run_dir=tmp_path)
    log = RolloutLog.for_run(run)
    path = log.write(7, "train", [logged, logged.model_copy(update={"episode_id": "e2"})], tokenizer)
    log.write(0, "validation", [logged], None)

    assert path == tmp_path / "rollouts" / "step_000007_train.jsonl"
    assert [p.name for p in log.files()] == ["step_000000_validation.jsonl", "step_000007_train.jsonl"]
    records = list(read_records(path))
    assert [r.episode_id for r in records] == ["e1", "e2"]
    record = records[0]
    assert (record.step, record.split, record.schema_version) == (7, "train", 1)
    assert record.task.metadata == {"ground_truth": 1} and record.duration_s == 0.5
    [logged_sample] = record.samples
    assert logged_sample.response_ids == reply and logged_sample.loss_mask == [1] * len(reply)
    assert len(logged_sample.prompt_tokens) == len(prompt)
    assert "".join(logged_sample.prompt_tokens) == tokenizer.decode(prompt)  # special tokens shown as text
    assert logged_sample.response_tokens[-1] == "<|im_end|>"
    # Each token is decoded alone: a multi-byte character split over tokens is not glued back.
    assert logged_sample.response_tokens == [tokenizer.decode([token]) for token in reply]
    # Without a tokenizer, ids are logged and token text is empty.
    [untokenized] = read_records(tmp_path / "rollouts" / "step_000000_validation.jsonl")
    assert untokenized.samples[0].prompt_tokens == [] and untokenized.samples[0].prompt_ids == prompt


def test_record_schema_rejects_misaligned_tokens():
    with pytest.raises(ValueError, match="response_tokens has 1 entries for 2 ids"):
        LoggedSample(prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1], logprobs=[0.0, 0.0],
                     prompt_tokens=["a"], response_tokens=["b"])
    schema = RolloutRecord.model_json_schema()
    assert {"step", "split", "samples", "status", "reward", "messages"} <= set(schema["properties"])


def test_records_read_back_can_be_written_again(tmp_path):
    tokenizer = tiny_tokenizer()
    ids = tokenizer.encode("hello", add_special_tokens=False)
    episode = Episode(episode_id="e1", task=Task(task_id="t1"), group_id="g",
                      samples=[Sample(prompt_ids=ids, response_ids=ids, loss_mask=[1] * len(ids),
                                      logprobs=[-0.5] * len(ids))])
    log = RolloutLog(tmp_path / "first")
    [record] = read_records(log.write(1, "train", [episode], tokenizer))
    [again] = read_records(RolloutLog(tmp_path / "second").write(2, "train", [record], tokenizer))
    assert again.step == 2 and again.samples[0].response_ids == ids
    assert again.samples[0].response_tokens == record.samples[0].response_tokens
