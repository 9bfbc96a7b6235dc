"""Several policies in one local run (config/policies.py): real gateway, the `hf` engine serving every
adapter at once, one trainer per policy. A workflow of three agents: a proposer and a checker, each
with its own policy, and an observer the map does not name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agenttune.errors import UserError

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

TINY = "tiny://h4-loop?layers=2&hidden=32&heads=2&kv_heads=1&intermediate=64"

WORKFLOW = '''
from agenttune import Judge, JudgeResult, Workflow, WorkflowOutput


class Team(Workflow):
    async def execute(self, task, tuner):
        texts = []
        for agent in ("proposer", "checker", "observer"):
            client = tuner.as_async_openai_client(agent=agent)
            response = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"{agent}: {task.query}"}], max_tokens=8)
            texts.append(response.choices[0].message.content or "")
        return WorkflowOutput(metadata={"final_answer": "".join(texts)})


class LengthJudge(Judge):
    """Varied, deterministic rewards from random text: enough signal for GRPO to take real steps."""

    def judge(self, judge_input):
        text = judge_input.final_answer or ""
        return JudgeResult(reward=float(len(text) % 3), success=len(text) % 3 == 2)


class AgentJudge(LengthJudge):
    """The team's reward, and each agent's: the checker's always 5 (policies.reward: per_agent)."""

    def judge(self, judge_input):
        result = super().judge(judge_input)
        result.agent_rewards = {"proposer": float(len(judge_input.final_answer or "") % 2), "checker": 5.0}
        return result
'''


def write_run_files(tmp_path: Path, policies: dict, **sections) -> Path:
    import yaml

    (tmp_path / "team_workflow.py").write_text(WORKFLOW, encoding="utf-8")
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    rows = [{"task_id": f"train-{i}", "query": f"Say {i}"} for i in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    config = {
        "workflow": "team_workflow:Team",
        "judge": {"judge_protocol": "team_workflow:LengthJudge"},
        "task_reader": {"type": "file", "path": str(data / "{split}.jsonl")},
        "model": {"path": TINY, "max_model_len": 256},
        "rollout": {"num_repeat": 3, "max_env_worker": 1, "max_response_length_in_one_turn": 8},
        "data": {"train_batch_size": 2},
        "trainer": {"total_steps": 2, "learning_rate": 1e-2, "weight_decay": 0.1, "save_freq": 1, "seed": 3},
        "local": {"device": "cpu", "micro_batch_tokens": 256, "plot": False},
        "monitor": {"tensorboard": False},
        "policies": policies,
        **sections,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def train(conf: Path, run_dir: Path, *overrides: str, resume: bool = False):
    from agenttune.entrypoints.train import train_from_config
    from agenttune.registry.config_loading import load_config

    return train_from_config(load_config(conf, list(overrides), backbone="local"), run_dir=run_dir, resume=resume)


def adapter(run_dir: Path, step: int, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / name / "adapter_model.safetensors")


def equal(left: dict, right: dict) -> bool:
    return left.keys() == right.keys() and all(torch.equal(left[key], right[key]) for key in left)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


TWO_POLICIES = {"adapters": {"proposer": {"rank": 4}, "checker": {"rank": 4, "learning_rate": 5e-3}},
                "agents": {"proposer": "proposer", "checker": "checker"}}


@pytest.mark.slow
def test_each_policy_trains_on_its_own_agents_samples_only(tmp_path):
    """The checker's samples are not trained (rollout.trainable_targets): its adapter must stay bitwise
    as it was although its optimizer (weight decay 0.1) exists and the proposer's samples train every
    step. The observer, unmapped, samples from the base model and is counted."""
    conf = write_run_files(tmp_path, TWO_POLICIES)
    run_dir = tmp_path / "run"
    train(conf, run_dir, "rollout.trainable_targets=[proposer,observer]")

    records = read_metrics(run_dir)[-2:]
    for record in records:
        assert record["policy/proposer/train/samples"] > 0
        assert record["policy/checker/train/samples"] == 0
        assert record["policies/untrained_samples"] > 0  # the observer's: trainable, but mapped to no policy
        assert record["unknown_agent_calls"] == 6  # 2 tasks x 3 episodes, one observer call each
    assert equal(adapter(run_dir, 1, "checker"), adapter(run_dir, 2, "checker"))
    assert not equal(adapter(run_dir, 1, "proposer"), adapter(run_dir, 2, "proposer"))
    # Step 2 samples the proposer's calls with its adapter (moved by step 1): the trainer, which scores them
    # with that adapter, finds the engine's logprobs.
    assert records[1]["policy/proposer/train/logprob_mismatch"] < 1e-3

    from transformers import AutoModelForCausalLM

    from agenttune.backbones.local.export import export_model

    with pytest.raises(UserError, match="--policy is missing"):
        export_model(run_dir, tmp_path / "exported")
    export_model(run_dir, tmp_path / "exported", policy="proposer")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    assert not any("lora" in name for name, _ in exported.named_parameters())


@pytest.mark.slow
def test_a_frozen_policy_stays_bitwise_unchanged_and_resume_is_exact(tmp_path):
    policies = {**TWO_POLICIES, "adapters": {"proposer": {"rank": 4}, "checker": {"rank": 4, "frozen": True}}}
    conf = write_run_files(tmp_path, policies)
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    train(conf, straight)
    records = read_metrics(straight)
    assert not any(key.startswith("policy/checker/") for record in records for key in record)
    assert equal(adapter(straight, 1, "checker"), adapter(straight, 2, "checker"))
    assert not any(value.abs().sum() for key, value in adapter(straight, 2, "checker").items() if "lora_B" in key)

    train(conf, interrupted, "trainer.total_steps=1")
    train(conf, interrupted, resume=True)
    for name in ("proposer", "checker"):
        assert equal(adapter(straight, 2, name), adapter(interrupted, 2, name)), name
    rewards = [record.get("reward/mean") for record in read_metrics(straight)]
    assert rewards == [record.get("reward/mean") for record in read_metrics(interrupted)]


@pytest.mark.parametrize(("policy", "says"), [
    ({"rank": 64}, "rank 64 is more than the smallest dimension"),
    ({"rank": 4, "target_modules": ["no_such_proj"]}, "policies.adapters.checker does not fit model.path"),
    ({"rank": 4, "target_modules": ["embed_tokens", "q_proj"]}, "only linear layers can be adapted"),
])
def test_adapters_that_do_not_fit_the_model_are_refused_before_step_1(tmp_path, policy, says):
    policies = {**TWO_POLICIES, "adapters": {"proposer": {"rank": 4}, "checker": policy}}
    conf = write_run_files(tmp_path, policies)
    with pytest.raises(UserError, match=says):
        train(conf, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_metrics(tmp_path / "run")


def test_lora_rank_is_refused_with_policies(tmp_path):
    conf = write_run_files(tmp_path, TWO_POLICIES)
    with pytest.raises(UserError, match="local.lora_rank"):
        train(conf, tmp_path / "lora", "local.lora_rank=4")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_asynchronous_modes_train_each_policy_with_its_own_rollout_correction(tmp_path, mode):
    """The engine samples from its own copy of the weights, refreshed after each step: the copy must follow
    every adapter. Step 2 trains on groups the copy sampled before step 1's update (one_step_off admits
    them at once), so the proposer's tokens are one version stale and rollout correction weighs them; the
    checker's samples are not trained and its adapter stays bitwise unchanged."""
    conf = write_run_files(tmp_path, TWO_POLICIES)
    run_dir = tmp_path / "run"
    train(conf, run_dir, f"trainer.mode={mode}", "trainer.max_staleness=1", "trainer.total_steps=3", "local.keep_checkpoints=3",
          "rollout.trainable_targets=[proposer,observer]")

    records = read_metrics(run_dir)
    assert [record["step"] for record in records] == [1, 2, 3]
    for record in records:
        assert record["policy/proposer/train/samples"] > 0 and record["policy/checker/train/samples"] == 0
        assert "policy/proposer/train/rollout_is_mean" in record  # asynchronous modes correct by default
    assert any(record.get("async/staleness_max", 0) >= 1 for record in records[1:])
    stale = [record for record in records if record.get("async/staleness_max", 0) >= 1]
    # Weighing stale tokens per policy: pi_old (the proposer's adapter now) over pi_rollout (its copy then).
    assert all(record["policy/proposer/train/logprob_mismatch"] > 0 for record in stale)
    for step in (1, 2):
        assert equal(adapter(run_dir, step, "checker"), adapter(run_dir, step + 1, "checker"))
        assert not equal(adapter(run_dir, step, "proposer"), adapter(run_dir, step + 1, "proposer"))


@pytest.mark.slow
def test_per_agent_rewards_train_each_policy_on_its_own_agents_reward(tmp_path):
    conf = write_run_files(tmp_path, {**TWO_POLICIES, "reward": "per_agent"},
                           judge={"judge_protocol": "team_workflow:AgentJudge"})
    run_dir = tmp_path / "run"
    train(conf, run_dir, "trainer.total_steps=1", "trainer.save_freq=0")
    (record,) = read_metrics(run_dir)
    assert record["policy/checker/reward/mean"] == 5.0
    assert record["policy/proposer/reward/mean"] <= 1.0  # its own agent's (0 or 1), not the team's (0-2)
    assert record["policies/episodes_without_agent_rewards"] == 0


def test_policy_rewards_are_the_teams_or_each_agents_own():
    from agenttune.backbones.local.policies import policy_reward, samples_of
    from agenttune.config.policies import PoliciesConfig
    from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
    from agenttune.workflow.task import Task

    def sample(agent: str) -> Sample:
        return Sample(agent=agent, prompt_ids=[1], response_ids=[2], loss_mask=[1], logprobs=[-0.5])

    episode = Episode(episode_id="e", task=Task(task_id="t", query="q"), group_id="g", reward=0.5,
                      samples=[sample("solver"), sample("checker"), sample("critic")],
                      agent_rewards={"solver": 1.0, "checker": 0.0, "critic": 0.5})
    adapters = {"solver": {}, "judges": {}}
    agents = {"solver": "solver", "checker": "judges", "critic": "judges"}
    team = PoliciesConfig(adapters=adapters, agents=agents)
    per_agent = PoliciesConfig(adapters=adapters, agents=agents, reward="per_agent")

    assert [policy_reward(episode, team, name) for name in ("solver", "judges")] == [0.5, 0.5]
    assert policy_reward(episode, per_agent, "solver") == 1.0
    (solver,) = samples_of([episode], per_agent, "solver")
    assert ([s.agent for s in solver.samples], solver.reward, solver.group_id) == (["solver"], 1.0, "g")
    # Two rated agents share "judges": a row each, its own samples, reward and advantage group.
    rows = samples_of([episode], per_agent, "judges")
    assert [([s.agent for s in row.samples], row.reward, row.group_id, row.episode_id) for row in rows] == [
        (["checker"], 0.0, "g/checker", "e/checker"), (["critic"], 0.5, "g/critic", "e/critic")]
    # An agent of the policy the judge did not rate: its samples train on the team's reward, in the task's group.
    with_unrated = episode.model_copy(update={"samples": [*episode.samples, sample("critic-2")]})
    rows = samples_of([with_unrated], PoliciesConfig(adapters=adapters, agents={**agents, "critic-2": "judges"},
                                                     reward="per_agent"), "judges")
    assert [([s.agent for s in row.samples], row.reward, row.group_id) for row in rows] == [
        (["checker"], 0.0, "g/checker"), (["critic"], 0.5, "g/critic"), (["critic-2"], 0.5, "g")]
    (shared,) = samples_of([episode], team, "judges")  # the team's reward: one row, both agents' samples
    assert ([s.agent for s in shared.samples], shared.reward) == (["checker", "critic"], 0.5)
    assert episode.reward == 0.5 and len(episode.samples) == 3  # the rollout's episode is left as it was
    # A judge that gives no agent rewards: every policy trains on the team's.
    assert policy_reward(episode.model_copy(update={"agent_rewards": None}), per_agent, "solver") == 0.5
    # A madness penalty replaced the judge's reward: every policy gets the penalty.
    mad = episode.model_copy(update={"status": EpisodeStatus.MADNESS, "reward": -1.0})
    assert [policy_reward(mad, per_agent, name) for name in ("solver", "judges")] == [-1.0, -1.0]
    assert [(row.reward, len(row.samples)) for row in samples_of([mad], per_agent, "judges")] == [(-1.0, 2)]


@pytest.mark.slow
def test_workflow_processes_route_each_agent_to_its_policy(tmp_path):
    """Episodes run in two worker processes, whose gateways reach the trainer's engine over a pipe: each
    agent's calls still sample with its own policy's adapter, and the unmapped observer is counted."""
    from agenttune.rollout.log import read_records

    conf = write_run_files(tmp_path, TWO_POLICIES)
    run_dir = tmp_path / "run"
    train(conf, run_dir, "rollout.workflow_processes=2", "trainer.total_steps=1", "trainer.save_freq=0")
    (record,) = read_metrics(run_dir)
    assert record["policy/proposer/train/samples"] > 0 and record["policy/checker/train/samples"] > 0
    assert record["unknown_agent_calls"] == 6
    episodes = list(read_records(run_dir / "rollouts" / "step_000001_train.jsonl"))
    assert len(episodes) == 6
    for episode in episodes:
        assert not episode.status.failed, episode.error
        assert {(sample.agent, sample.policy) for sample in episode.samples} == {
            ("proposer", "proposer"), ("checker", "checker"), ("observer", None)}
