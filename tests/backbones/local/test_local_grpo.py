"""The local backbone's GRPO math on hand-made episodes and a tiny locally built model."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agenttune.backbones.local.advantages import StepAdvantages, step_advantages
from agenttune.backbones.local.batching import build_items, micro_batches
from agenttune.components.estimators.outcome import GRPOEstimator, GRPOOptions
from agenttune.config.models import AgentTuneConfig
from agenttune.registry.config_loading import load_config
from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
from agenttune.workflow.task import Task

torch = pytest.importorskip("torch")

TINY = "tiny://h4-grpo?layers=2&hidden=32&heads=2&kv_heads=1&intermediate=64&vocab=300"


def episode(group: str, index: int, reward: float, samples=(), status=EpisodeStatus.OK) -> Episode:
    return Episode(episode_id=f"{group}-{index}", task=Task(task_id=group), group_id=group, repeat_index=index,
                   reward=reward, status=status, samples=list(samples))


def random_sample(rng: random.Random, vocab: int = 300) -> Sample:
    """A multi-turn-shaped sample: generated tokens (mask 1) interleaved with inserted context (mask 0)."""
    response, mask = [], []
    for turn in range(rng.randint(1, 3)):
        if turn:
            context = rng.randint(1, 4)
            response += [rng.randrange(3, vocab) for _ in range(context)]
            mask += [0] * context
        generated = rng.randint(1, 6)
        response += [rng.randrange(3, vocab) for _ in range(generated)]
        mask += [1] * generated
    return Sample(prompt_ids=[rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))], response_ids=response,
                  loss_mask=mask, logprobs=[-rng.random() * 3 if m else 0.0 for m in mask])


def step_episodes(step: int, groups: int = 3, repeat: int = 4) -> list[Episode]:
    rng = random.Random(step)
    return [episode(f"s{step}g{g}", r, rng.choice([0.0, 0.5, 1.0]), [random_sample(rng)])
            for g in range(groups) for r in range(repeat)]


# -- advantages -------------------------------------------------------------------------------------
def group_advantages(episodes: list[Episode], norm_by_std: bool = True) -> StepAdvantages:
    """GRPO's advantages of the informative groups (zero_variance_groups: drop)."""
    estimator = GRPOEstimator(GRPOOptions(norm_by_std=norm_by_std))
    return step_advantages(episodes, estimator, zero_variance="drop")


def reference_advantages(rewards_by_group: dict[str, list[float]], norm: bool) -> dict[str, float]:
    """An independent computation with the statistics module (sample std, as verl and TRL)."""
    expected = {}
    for group, rewards in rewards_by_group.items():
        if len(rewards) < 2 or len(set(rewards)) == 1:
            continue
        mean, std = statistics.mean(rewards), statistics.stdev(rewards)
        for index, reward in enumerate(rewards):
            expected[f"{group}-{index}"] = (reward - mean) / (std + 1e-6) if norm else reward - mean
    return expected


@settings(max_examples=60, deadline=None)
@given(
    groups=st.dictionaries(
        st.sampled_from("abcdef"),
        st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 3.0]), min_size=1, max_size=8),
        min_size=1,
    ),
    norm=st.booleans(),
)
def test_advantages_match_an_independent_computation(groups, norm):
    episodes = [episode(group, index, reward) for group, rewards in groups.items() for index, reward in enumerate(rewards)]
    result = group_advantages(episodes, norm_by_std=norm)
    expected = reference_advantages(groups, norm)
    assert result.by_episode.keys() == expected.keys()
    for key, value in expected.items():
        assert result.by_episode[key] == pytest.approx(value, rel=1e-9, abs=1e-12)
    flat = sum(1 for rewards in groups.values() if len(rewards) < 2 or len(set(rewards)) == 1)
    assert result.zero_variance_groups == flat
    assert result.num_groups == len(groups)


def test_failed_episodes_are_left_out_of_the_group_statistics():
    episodes = [episode("g", 0, 1.0), episode("g", 1, 0.0), episode("g", 2, 0.0, status=EpisodeStatus.TIMEOUT)]
    result = group_advantages(episodes)
    assert result.failed_episodes == 1
    assert set(result.by_episode) == {"g-0", "g-1"}
    assert result.by_episode["g-0"] == pytest.approx(-result.by_episode["g-1"])


# -- batching ---------------------------------------------------------------------------------------
def test_items_keep_the_mask_aligned_and_micro_batches_respect_the_budget():
    rng = random.Random(0)
    episodes = [episode("g", i, float(i % 2), [random_sample(rng)]) for i in range(20)]
    advantages = group_advantages(episodes).by_episode
    items, stats = build_items(episodes, advantages, max_prompt_length=100, max_response_length=100)
    assert len(items) == 20 and stats.too_long_prompt == 0
    for item, ep in zip(items, episodes, strict=True):
        sample = ep.samples[0]
        assert item.input_ids == sample.prompt_ids + sample.response_ids
        assert item.loss_mask == [0] * len(sample.prompt_ids) + sample.loss_mask
    budget = 60
    batches = micro_batches(items, budget)
    assert sorted(id(i) for batch in batches for i in batch) == sorted(id(i) for i in items)
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(len(i) for i in batch) <= budget


def test_long_samples_are_split_or_dropped_and_counted_never_cut():
    long_prompt = Sample(prompt_ids=[5] * 50, response_ids=[6, 7], loss_mask=[1, 1], logprobs=[-1.0, -1.0])
    one_long_call = Sample(prompt_ids=[5], response_ids=[6] * 30, loss_mask=[1] * 30, logprobs=[-1.0] * 30)
    two_calls = Sample(prompt_ids=[5], response_ids=[6] * 6 + [9] + [7] * 6, loss_mask=[1] * 6 + [0] + [1] * 6,
                       logprobs=[-1.0] * 13)
    episodes = [episode("g", 0, 1.0, [long_prompt, one_long_call, two_calls]), episode("g", 1, 0.0)]
    items, stats = build_items(episodes, group_advantages(episodes).by_episode,
                               max_prompt_length=10, max_response_length=8)
    assert stats.too_long_prompt == 1 and stats.split == 3
    assert stats.dropped_calls == {"prompt_too_long": 1, "call_too_long": 1}
    # the two-call sample became two items, the second with the first call as its prompt
    assert [item.input_ids for item in items] == [[5] + [6] * 6, [5] + [6] * 6 + [9] + [7] * 6]
    assert [sum(item.loss_mask) for item in items] == [6, 6]


# -- the trainer on a real (tiny) transformers model ---------------------------------------------------
def make_config(**sections) -> AgentTuneConfig:
    return load_config({"model": {"path": TINY}, "trainer": {"learning_rate": 1e-3}, **sections})


def make_trainer(config, checkpoint=None, total_steps=4):
    from agenttune.backbones.local.policy import load_policy, reference_scope
    from agenttune.backbones.local.train_step import GRPOTrainer

    torch.manual_seed(0)
    model = load_policy(config, torch.device("cpu"), checkpoint=checkpoint)
    reference = reference_scope(config, model, torch.device("cpu"))
    return GRPOTrainer(model, config, pad_token_id=0, total_steps=total_steps, reference=reference)


def parameters(model) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.named_parameters()}


def test_gradients_are_zero_on_loss_mask_0_tokens():
    """The gradient reaching the logits is exactly zero at every position whose target is not trained
    (the padded path's full logits; the packed path never computes logits there at all)."""
    config = make_config(local={"micro_batch_tokens": 100_000, "update_path": "padded"}, algorithm={"kl_coef": 0.1})
    trainer = make_trainer(config)
    captured = []

    def keep_logits(module, args, kwargs, output):
        output.logits.retain_grad()
        captured.append((kwargs["input_ids"], output.logits))

    handle = trainer.model.register_forward_hook(keep_logits, with_kwargs=True)
    episodes = step_episodes(0)
    metrics = trainer.step(episodes)
    handle.remove()
    assert metrics["train/updates"] == 1
    input_ids, logits = next((ids, out) for ids, out in captured if out.grad is not None)
    samples = {tuple(s.prompt_ids + s.response_ids): s for e in episodes for s in e.samples}
    checked_zero = checked_nonzero = 0
    for row, ids in enumerate(input_ids.tolist()):
        sample = next(s for key, s in samples.items() if ids[: len(key)] == list(key))
        mask = [0] * len(sample.prompt_ids) + sample.loss_mask
        row_grad = logits.grad[row]
        for position in range(len(ids) - 1):  # logits at `position` score token position + 1
            norm = row_grad[position].abs().sum().item()
            target_trained = position + 1 < len(mask) and mask[position + 1] == 1
            if target_trained:
                checked_nonzero += norm > 0
            else:
                assert norm == 0.0, f"gradient leaks into an untrained position {position}"
                checked_zero += 1
    assert checked_zero > 20 and checked_nonzero > 10


def test_training_moves_the_policy_towards_rewarded_tokens():
    """Two responses per prompt, one rewarded: after a few steps its log-prob rises, the other's falls."""
    config = make_config(trainer={"learning_rate": 3e-3})
    trainer = make_trainer(config)
    prompt, good, bad = [10, 11, 12], [40, 41, 42], [50, 51, 52]

    def sample(response):
        return Sample(prompt_ids=prompt, response_ids=response, loss_mask=[1, 1, 1], logprobs=[-1.0] * 3)

    def logprob(response):
        from agenttune.backbones.local.batching import TrainItem
        from agenttune.backbones.local.logprobs import collate, token_logprobs

        item = TrainItem(prompt + response, [0, 0, 0, 1, 1, 1], [0.0] * 6, 0.0)
        with torch.no_grad():
            values, _ = token_logprobs(trainer.model, collate([item], 0, "cpu"))
        return float(values[0, 2:].sum())

    before = logprob(good), logprob(bad)
    for step in range(5):
        trainer.step([episode(f"s{step}", 0, 1.0, [sample(good)]), episode(f"s{step}", 1, 0.0, [sample(bad)])])
    after = logprob(good), logprob(bad)
    assert after[0] > before[0] + 0.5 and after[1] < before[1] - 0.5


@pytest.mark.parametrize(("mode", "samples"), [("keep", 4), ("drop", 0)])
def test_zero_variance_steps_change_nothing_but_the_schedule(mode, samples):
    """keep: the group's samples are in the batch with advantage 0 (verl's denominator); drop: left out."""
    trainer = make_trainer(make_config(algorithm={"zero_variance_groups": mode}))
    before = parameters(trainer.model)
    metrics = trainer.step([episode("g", i, 1.0, [random_sample(random.Random(i))]) for i in range(4)])
    assert metrics["train/zero_variance_groups"] == 1 and metrics["train/samples"] == samples
    assert all(torch.equal(before[name], value) for name, value in parameters(trainer.model).items())


def test_keep_puts_zero_variance_tokens_in_the_token_mean_denominator():
    """The same informative group trains with a smaller loss scale when a zero-variance group is kept:
    pg_loss = sum(A * tokens) / all trained tokens (verl's token-mean), not / the informative tokens."""
    rng = random.Random(3)
    informative = [episode("a", i, float(i % 2), [random_sample(rng)]) for i in range(4)]
    flat = [episode("b", i, 1.0, [random_sample(rng)]) for i in range(4)]
    losses = {}
    for mode in ("keep", "drop"):
        trainer = make_trainer(make_config(algorithm={"zero_variance_groups": mode}))
        metrics = trainer.step(informative + flat)
        losses[mode] = (metrics["train/pg_loss"], metrics["train/trained_tokens"])
    informative_tokens = sum(s.num_trained_tokens for e in informative for s in e.samples)
    flat_tokens = sum(s.num_trained_tokens for e in flat for s in e.samples)
    assert losses["drop"][1] == informative_tokens and losses["keep"][1] == informative_tokens + flat_tokens
    assert losses["keep"][0] == pytest.approx(losses["drop"][0] * informative_tokens / (informative_tokens + flat_tokens),
                                              rel=1e-5)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_gradient_accumulation_matches_one_big_batch(mode):
    """Splitting a step into micro-batches must not change the update (the denominators are global). (One
    update thread: several split a step into several micro-batches whatever the budget, test_update_threads.py.)"""
    results = []
    for budget in (100_000, 24):
        config = make_config(local={"micro_batch_tokens": budget, "update_threads": 1}, algorithm={"loss_agg_mode": mode})
        trainer = make_trainer(config)
        metrics = trainer.step(step_episodes(1))
        results.append((parameters(trainer.model), metrics["train/micro_batches"]))
    (big, one), (small, many) = results
    assert one == 1 and many > 3
    for name in big:  # updates are ~lr=1e-3 per weight; float noise is far below 1e-5
        torch.testing.assert_close(small[name], big[name], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_four_steps_equal_two_steps_a_checkpoint_and_two_more(tmp_path):
    from agenttune.backbones.local.checkpoint import (
        CheckpointState,
        latest_checkpoint,
        load_trainer_state,
        restore_rng,
        save_checkpoint,
    )

    config = make_config(
        trainer={"lr_schedule": "cosine", "warmup_steps": 1},
        local={"ppo_epochs": 2, "mini_batches": 2, "micro_batch_tokens": 64},
        algorithm={"kl_coef": 0.05},
    )
    straight = make_trainer(config)
    for step in range(4):
        straight.step(step_episodes(step))

    first = make_trainer(config)
    for step in range(2):
        first.step(step_episodes(step))
    state = CheckpointState(step=2, task_order={}, base_model=TINY, lora=False)
    save_checkpoint(tmp_path, state, model=first.model, tokenizer=None, trainer_state=first.state_dict(), keep=1)
    del first

    path = latest_checkpoint(tmp_path)
    resumed = make_trainer(config, checkpoint=path / "model")
    resumed.load_state_dict(load_trainer_state(path))
    restore_rng(path)
    for step in range(2, 4):
        resumed.step(step_episodes(step))

    expected, got, initial = parameters(straight.model), parameters(resumed.model), parameters(make_trainer(config).model)
    changed = [name for name in expected if not torch.equal(expected[name], initial[name])]
    assert changed, "training did not change the weights at all"
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6)
    assert resumed.scheduler.last_epoch == straight.scheduler.last_epoch == 4


def test_lora_trains_only_the_adapter_and_uses_the_base_as_reference():
    pytest.importorskip("peft")
    config = make_config(local={"lora_rank": 4, "lora_alpha": 8}, algorithm={"kl_coef": 0.1},
                         trainer={"learning_rate": 1e-2})
    trainer = make_trainer(config)
    before = parameters(trainer.model)
    metrics = trainer.step(step_episodes(0))
    after = parameters(trainer.model)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("lora_" in name for name in changed)
    assert metrics["train/kl"] == pytest.approx(0.0, abs=1e-9)  # adapter B starts at zero: policy == base
    metrics = trainer.step(step_episodes(1))
    assert metrics["train/kl"] > 0


def test_gradient_checkpointing_gives_the_same_update():
    results = []
    for checkpointing in (False, True):
        trainer = make_trainer(make_config(local={"gradient_checkpointing": checkpointing}))
        assert trainer.model.is_gradient_checkpointing == checkpointing
        trainer.step(step_episodes(2))
        results.append(parameters(trainer.model))
    for name in results[0]:
        torch.testing.assert_close(results[1][name], results[0][name], rtol=0, atol=1e-5)


def test_a_merged_sample_over_the_limits_is_split_at_call_boundaries():
    """Each part keeps its full prompt; a call that fits in no part is dropped and counted (issue 24)."""
    from agenttune.workflow.episode import fit_to_limits

    merged = Sample(prompt_ids=[1, 2, 3], response_ids=[10, 11, 90, 91, 12, 13, 14, 92, 15],
                    loss_mask=[1, 1, 0, 0, 1, 1, 1, 0, 1], logprobs=[-1.0] * 9, num_calls=3)
    assert fit_to_limits(merged, 100, 100).parts == [merged]  # fits: untouched
    fitted = fit_to_limits(merged, 100, 5)
    assert fitted.split and fitted.dropped_calls == 0
    assert [(p.prompt_ids, p.response_ids, p.loss_mask) for p in fitted.parts] == [
        ([1, 2, 3], [10, 11], [1, 1]),
        ([1, 2, 3, 10, 11, 90, 91], [12, 13, 14, 92, 15], [1, 1, 1, 0, 1])]
    assert sum(p.num_calls for p in fitted.parts) == 3
    # the second part's prompt (7 tokens) is over a 6-token prompt limit: its calls are dropped
    fitted = fit_to_limits(merged, 6, 5)
    assert [p.response_ids for p in fitted.parts] == [[10, 11]]
    assert fitted.dropped == {"prompt_too_long": 2}
    # a first prompt over the limit: nothing fits
    assert fit_to_limits(merged, 2, 100).parts == [] and fit_to_limits(merged, 2, 100).dropped_calls == 3


def test_each_dropped_call_is_counted_under_its_own_reason():
    """4 calls too long and then 2 whose prompts are too long: counted 4 + 2, not 6 under the last reason
    (issue 36). The calls are the recorded spans: forced tokens (mask 0) inside a call do not split it."""
    from agenttune.workflow.episode import fit_all, fit_to_limits

    long_call = [1, 0, 1, 1, 0, 1]  # a guided reply: forced tokens inside, one call
    mask = long_call * 4 + [0, 0] + [1, 1] + [0] + [1, 1]
    spans = [(0, 6), (6, 12), (12, 18), (18, 24), (26, 28), (29, 31)]
    merged = Sample(prompt_ids=[1], response_ids=list(range(31)), loss_mask=mask, logprobs=[-1.0] * 31,
                    num_calls=6, call_spans=spans)
    fitted = fit_to_limits(merged, max_prompt_length=20, max_response_length=5)
    assert fitted.parts == [] and fitted.dropped == {"call_too_long": 4, "prompt_too_long": 2}
    fitted = fit_to_limits(merged, max_prompt_length=25, max_response_length=6)  # each long call alone
    assert [part.num_calls for part in fitted.parts] == [1, 1, 1, 1] and fitted.dropped == {"prompt_too_long": 2}
    fitted = fit_to_limits(merged, max_prompt_length=28, max_response_length=6)  # the short two together
    assert [part.calls for part in fitted.parts] == [[(0, 6)]] * 4 + [[(0, 2), (3, 5)]] and not fitted.dropped
    total = fit_all([merged, merged], max_prompt_length=20, max_response_length=5)
    assert total.dropped == {"call_too_long": 8, "prompt_too_long": 4} and total.dropped_calls == 12
    with pytest.raises(ValueError, match="call spans"):
        merged.model_copy(update={"num_calls": 5}).model_post_init(None)


def test_the_trainer_recomputes_logprobs_the_engine_did_not_report():
    """Such samples take the trainer's own logprobs: no mismatch is invented for them."""
    trainer = make_trainer(make_config())
    episodes = step_episodes(0)
    for episode in episodes:
        for sample in episode.samples:
            sample.engine_logprobs = False
            sample.logprobs = [0.0] * len(sample.logprobs)  # placeholders, as the timeline writes them
    metrics = trainer.step(episodes)
    assert metrics["train/samples_logprobs_recomputed"] == len(episodes)
    assert metrics["train/logprob_mismatch"] == pytest.approx(0.0, abs=1e-6)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
