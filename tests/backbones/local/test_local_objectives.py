"""What the local backbone does around the estimator: dynamic sampling, overlong shaping, per-call
advantages, and per-turn rewards reaching the episode."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenttune.backbones.local.advantages import per_row, step_advantages
from agenttune.backbones.local.async_rollouts import GroupPipeline
from agenttune.backbones.local.dynamic_sampling import fill_batch, split_groups
from agenttune.components.estimators.outcome import GRPOEstimator, ReinforcePlusPlusBaselineEstimator
from agenttune.components.estimators.turns import TurnGRPOEstimator
from agenttune.config.objective_options import OverlongShapingOptions
from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
from agenttune.workflow.task import Task


def sample(generated: int = 3, calls: int = 1) -> Sample:
    response, mask = [], []
    for call in range(calls):
        if call:
            response += [9, 9]
            mask += [0, 0]
        response += [5] * generated
        mask += [1] * generated
    return Sample(prompt_ids=[1, 2], response_ids=response, loss_mask=mask, logprobs=[-0.5 if m else 0.0 for m in mask],
                  num_calls=calls)


def group(name: str, rewards: list[float], failed: int = 0) -> list[Episode]:
    episodes = [Episode(episode_id=f"{name}-{i}", task=Task(task_id=name), group_id=name, repeat_index=i,
                        reward=reward, samples=[sample()]) for i, reward in enumerate(rewards)]
    episodes += [Episode(episode_id=f"{name}-x{i}", task=Task(task_id=name), group_id=name, reward=1.0,
                         status=EpisodeStatus.ENGINE_ERROR) for i in range(failed)]
    return episodes


class Rollouts:
    """Fresh batches of groups from a seeded source; `informative` is the chance a group has spread."""

    def __init__(self, seed: int, groups: int, informative: float):
        self.rng, self.groups, self.informative, self.batches = random.Random(seed), groups, informative, 0

    async def __call__(self) -> list[Episode]:
        self.batches += 1
        episodes = []
        for g in range(self.groups):
            name = f"b{self.batches}g{g}"
            size = self.rng.randint(2, 6)
            if self.rng.random() < self.informative:
                rewards = [self.rng.choice([0.0, 1.0]) for _ in range(size - 1)] + [0.5]
            else:
                rewards = [self.rng.choice([0.0, 1.0])] * size
            episodes += group(name, rewards, failed=self.rng.randint(0, 1))
        return episodes


# -- dynamic sampling -----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 6), informative=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
       retries=st.integers(0, 5))
def test_dynamic_sampling_trains_only_groups_with_spread_and_always_stops(seed, batch, informative, retries):
    source = Rollouts(seed, batch, informative)

    async def run():
        return await fill_batch(await source(), source, estimator=GRPOEstimator(), batch_size=batch,
                                max_retries=retries)

    trained, rolled_out, metrics = asyncio.run(run())
    groups = split_groups(trained)
    assert all(len({e.reward for e in members if not e.status.failed}) > 1 for members in groups)
    assert len(groups) == metrics["train/informative_groups"] <= batch
    assert source.batches == 1 + metrics["train/dynamic_sampling_rounds"] <= 1 + retries  # bounded
    assert metrics["train/dynamic_sampling_short"] == batch - len(groups)
    if metrics["train/dynamic_sampling_short"]:
        assert metrics["train/dynamic_sampling_rounds"] == retries  # short only once the retries are spent
    if informative == 1.0:
        assert len(groups) == batch and metrics["train/dynamic_sampling_rounds"] == 0
    total_groups = len(split_groups(rolled_out))
    assert total_groups == len(groups) + metrics["train/dynamic_sampling_discarded_groups"] + metrics[
        "train/dynamic_sampling_surplus_groups"]


def test_dynamic_sampling_in_the_async_pipeline_replaces_groups_without_spread_and_is_bounded():
    rng = random.Random(0)

    class Rollout:
        async def run_tasks(self, tasks, *, priority=None):
            await asyncio.sleep(0)
            task = tasks[0]
            informative = rng.random() < 0.4
            rewards = [0.0, 1.0, 1.0] if informative else [1.0, 1.0, 1.0]
            return group(task.task_id, rewards)

    numbers = iter(range(10_000))

    def next_tasks():
        return [Task(task_id=f"t{next(numbers)}") for _ in range(2)]

    def informative(candidate):
        return len({episode.reward for episode in candidate.episodes}) > 1

    async def run(max_rejected):
        pipeline = GroupPipeline(Rollout(), next_tasks, batch_size=2, bound=1, version=0,
                                 accept=informative, max_rejected=max_rejected)
        batches = []
        try:
            for step in range(1, 4):
                batches.append(await asyncio.wait_for(pipeline.next_batch(), timeout=30))
                pipeline.advance(step)  # as the training loop does after each update
            return batches
        finally:
            await pipeline.aclose()

    for groups, metrics in asyncio.run(run(max_rejected=50)):
        assert len(groups) == 2 and all(informative(g) for g in groups)
        assert metrics["train/informative_groups"] == 2
    for groups, metrics in asyncio.run(run(max_rejected=0)):  # no retries: short batches, never a flat group
        assert all(informative(g) for g in groups) and metrics["train/dynamic_sampling_discarded_groups"] <= 1


# -- zero-variance groups, overlong shaping, failures -----------------------------------------------------
def test_keep_gives_flat_groups_advantage_zero_and_drop_leaves_them_out():
    episodes = group("a", [1.0, 0.0]) + group("b", [1.0, 1.0]) + group("c", [1.0])
    kept = step_advantages(episodes, GRPOEstimator(), zero_variance="keep")
    assert kept.by_episode["b-0"] == kept.by_episode["b-1"] == 0.0
    assert kept.by_episode["c-0"] == pytest.approx(1.0 / (1.0 + 1e-6))  # verl's rule for a group of one
    assert kept.zero_variance_groups == 2
    dropped = step_advantages(episodes, GRPOEstimator(), zero_variance="drop")
    assert set(dropped.by_episode) == {"a-0", "a-1"} and dropped.zero_variance_groups == 2


def test_a_batch_baseline_keeps_single_episode_groups_informative():
    episodes = group("a", [1.0]) + group("b", [0.0])
    result = step_advantages(episodes, ReinforcePlusPlusBaselineEstimator(), zero_variance="drop")
    assert result.zero_variance_groups == 0 and result.by_episode["a-0"] > 0 > result.by_episode["b-0"]


@pytest.mark.parametrize(("tokens", "penalty"), [(0, 0.0), (6, 0.0), (7, 0.25), (8, 0.5), (10, 1.0), (40, 1.0)])
def test_overlong_penalty_follows_dapo(tokens, penalty):
    options = OverlongShapingOptions(enable=True, max_length=10, buffer=4, penalty=1.0)
    assert options.penalty_for(tokens) == pytest.approx(penalty)
    episode = Episode(episode_id="e", task=Task(task_id="t"), group_id="g", reward=1.0, samples=[sample(tokens)])
    other = Episode(episode_id="f", task=Task(task_id="t"), group_id="g", reward=1.0, samples=[sample(1)])
    result = step_advantages([episode, other], GRPOEstimator(), overlong=options)
    assert result.overlong_penalty == pytest.approx(penalty)
    assert (result.by_episode["e"] < 0) == (penalty > 0)


def test_overlong_options_refuse_a_buffer_longer_than_the_limit():
    with pytest.raises(ValueError, match="buffer"):
        OverlongShapingOptions(enable=True, max_length=4, buffer=8)


# -- per-call advantages ------------------------------------------------------------------------------------
def test_per_call_advantages_train_each_call_as_its_own_row():
    episodes = [Episode(episode_id="a", task=Task(task_id="t"), group_id="g", reward=1.0, turn_rewards=[0.5, 0.0, 0.0],
                        samples=[sample(2, calls=3)]),
                Episode(episode_id="b", task=Task(task_id="t"), group_id="g", reward=0.0, turn_rewards=[0.0],
                        samples=[sample(2, calls=1)])]
    advantages = step_advantages(episodes, TurnGRPOEstimator())
    rows, by_row = per_row(episodes, advantages)
    assert [row.episode_id for row in rows] == ["a/call0", "a/call1", "a/call2", "b/call0"]
    assert [by_row[row.episode_id] for row in rows] == [*advantages.by_call["a"], *advantages.by_call["b"]]
    second = rows[1].samples[0]  # the second call, with the first call and the tool result as its prompt
    assert second.prompt_ids == [1, 2, 5, 5, 9, 9] and second.response_ids == [5, 5] and second.loss_mask == [1, 1]
    assert by_row["a/call0"] > by_row["a/call2"] > by_row["b/call0"]  # the turn reward credits the first call


# -- on-policy distillation in the trainer ----------------------------------------------------------------
TINY = "tiny://h4-distil?layers=2&hidden=32&heads=2&kv_heads=1&intermediate=64&vocab=300"


def test_distillation_steps_bring_the_student_towards_the_teacher_on_its_own_tokens(tmp_path):
    torch = pytest.importorskip("torch")
    from agenttune.backbones.local.policy import load_policy, load_pretrained
    from agenttune.backbones.local.train_step import GRPOTrainer
    from agenttune.components.engines.model_loading import resolve_model_path
    from agenttune.registry.config_loading import load_config

    torch.manual_seed(5)
    base = load_config({"model": {"path": TINY}})
    teacher = load_pretrained(resolve_model_path("tiny://teacher?layers=2&hidden=32&heads=2&kv_heads=1&intermediate=64"
                                                 "&vocab=300"), base, torch.device("cpu"))
    teacher.save_pretrained(tmp_path / "teacher")
    config = load_config({"model": {"path": TINY}, "trainer": {"learning_rate": 1e-2},
                          "algorithm": {"policy_loss": "distillation",
                                        "policy_loss_options": {"teacher": str(tmp_path / "teacher")}}})
    model = load_policy(config, torch.device("cpu"))
    trainer = GRPOTrainer(model, config, pad_token_id=0, total_steps=10)
    rng = random.Random(1)
    episodes = []
    for index in range(4):
        response = [rng.randrange(3, 300) for _ in range(8)]
        episodes.append(Episode(episode_id=f"e{index}", task=Task(task_id="t"), group_id="g", reward=float(index % 2),
                                samples=[Sample(prompt_ids=[5, 6, 7], response_ids=response, loss_mask=[1] * 8,
                                                logprobs=[-1.0] * 8)]))

    def token_gaps() -> list[float]:
        """log π_student - log π_teacher of every sampled token."""
        gaps = []
        for episode in episodes:
            sample = episode.samples[0]
            ids = torch.tensor([sample.prompt_ids + sample.response_ids])
            with torch.no_grad():
                student, master = (torch.log_softmax(m(ids).logits[0, :-1], -1) for m in (model, teacher))
            targets = ids[0, 1:]
            gaps += [float(student[p, targets[p]] - master[p, targets[p]])
                     for p in range(len(sample.prompt_ids) - 1, ids.shape[1] - 1)]
        return gaps

    before = token_gaps()
    first = trainer.step(episodes)
    # the teacher's log-probs reach the loss: the step's reverse-KL sample is the one computed here
    assert first["train/teacher_reverse_kl"] == pytest.approx(sum(before) / len(before), abs=1e-5)
    for _ in range(7):
        trainer.step(episodes)
    after = token_gaps()
    assert sum(map(abs, after)) < 0.9 * sum(map(abs, before)), (before, after)


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    from agenttune.backbones.local.policy import load_policy, load_pretrained
    from agenttune.backbones.local.train_step import GRPOTrainer
    from agenttune.components.engines.model_loading import resolve_model_path
    from agenttune.errors import UserError
    from agenttune.registry.config_loading import load_config

    base = load_config({"model": {"path": TINY}})
    load_pretrained(resolve_model_path("tiny://other?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64&vocab=400"),
                    base, torch.device("cpu")).save_pretrained(tmp_path / "teacher")
    config = load_config({"model": {"path": TINY}, "algorithm": {
        "policy_loss": "distillation", "policy_loss_options": {"teacher": str(tmp_path / "teacher")}}})
    with pytest.raises(UserError, match=r"vocabulary of \d+ tokens, the student .* one of \d+"):
        GRPOTrainer(load_policy(config, torch.device("cpu")), config, pad_token_id=0, total_steps=1)
