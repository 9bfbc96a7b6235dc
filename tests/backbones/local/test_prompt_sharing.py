"""A group's samples hold their common prompt once in the packed update (issue 39), on a real tiny Qwen2."""

from __future__ import annotations

import random

import pytest

from agenttune.backbones.local.batching import TrainItem
from agenttune.workflow.episode import Sample

torch = pytest.importorskip("torch")

from test_local_grpo import episode, make_config, make_trainer, parameters  # noqa: E402
from test_local_packed import assert_relatively_close, grads  # noqa: E402

from agenttune.backbones.local.logprobs import collate, collate_packed, token_logprobs  # noqa: E402
from agenttune.backbones.local.packing import pack  # noqa: E402
from agenttune.backbones.local.prompt_sharing import (  # noqa: E402
    UNIT_TOKENS,
    share_prompts,
    supports_prompt_sharing,
)


def item(ids: list[int], mask: list[int], advantage: float = 1.0) -> TrainItem:
    return TrainItem(ids, mask, [-0.5] * len(ids), advantage)


def group_items(seed: int, groups: int = 3, repeat: int = 4, vocab: int = 300) -> list[TrainItem]:
    """`groups` prompts, each answered `repeat` times (multi-turn responses: trained and inserted tokens),
    plus one sample alone; the groups' samples shuffled together as a step's are."""
    rng = random.Random(seed)
    items = []
    for _ in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 12))]
        for _ in range(repeat):
            response = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))]
            mask = [rng.choice([0, 1, 1]) for _ in response]
            mask[0] = 1
            items.append(item(prompt + response, [0] * len(prompt) + mask, rng.choice([-1.0, 0.5, 1.0])))
    items.append(item([7, 8, 9, 10], [0, 0, 1, 1]))
    rng.shuffle(items)
    return items


# -- grouping -----------------------------------------------------------------------------------------
def test_samples_with_the_same_untrained_beginning_become_one_unit():
    a1, a2, a3 = (item([5, 6, 7, 20 + n, 30], [0, 0, 0, 1, 1]) for n in range(3))
    lone = item([5, 9, 7, 40], [0, 0, 0, 1])  # another prompt
    first_token_trained = item([5, 50], [1, 1])
    units = share_prompts([a1, lone, a2, first_token_trained, a3], token_budget=1000)
    shared = [unit for unit in units if unit.shared]
    assert len(shared) == 1 and shared[0].shared == 2  # token 7 scores the first trained token: each keeps it
    assert {id(x) for x in shared[0].items} == {id(a1), id(a2), id(a3)}
    assert len(shared[0]) == 2 + 3 * 3  # the prompt once, then each sample's rest
    assert sorted(len(unit.items) for unit in units) == [1, 1, 3]
    assert all(unit.shared == 0 for unit in units if len(unit.items) == 1)


def test_a_group_larger_than_a_unit_is_split_into_units_that_fit():
    prompt = [3] * 1000
    items = [item(prompt + [4] * 400, [0] * 1000 + [1] * 400) for _ in range(8)]
    units = share_prompts(items, token_budget=10**6)
    assert sum(len(unit.items) for unit in units) == 8
    assert all(len(unit) <= UNIT_TOKENS for unit in units) and len(units) == 4  # 999 + 2 x 401 each
    assert all(unit.shared == 999 for unit in units)
    small_budget = share_prompts(items, token_budget=1500)  # a unit must fit a micro-batch
    assert all(len(unit) <= 1500 for unit in small_budget) and all(len(u.items) == 1 for u in small_budget)
    long = [item(prompt + [4] * 2000, [0] * 1000 + [1] * 2000) for _ in range(3)]  # 3000 tokens each
    assert all(unit.shared == 0 and len(unit.items) == 1 for unit in share_prompts(long, token_budget=10**6))


def test_the_packed_rows_hold_the_prompt_once_under_a_tree_mask():
    a, b = item([5, 6, 7, 8], [0, 0, 1, 1]), item([5, 6, 9], [0, 0, 1])
    units = share_prompts([a, b], token_budget=100)
    packing = pack(units, "cpu", pad_token_id=0)
    assert packing.input_ids.tolist() == [[5, 6, 7, 8, 6, 9]]  # [5] once, then [6, 7, 8] and [6, 9]
    assert packing.position_ids.tolist() == [[0, 1, 2, 3, 1, 2]]
    allowed = packing.attention_mask[0, 0].int().tolist()
    assert allowed == [[1, 0, 0, 0, 0, 0],
                       [1, 1, 0, 0, 0, 0],
                       [1, 1, 1, 0, 0, 0],
                       [1, 1, 1, 1, 0, 0],
                       [1, 0, 0, 0, 1, 0],  # b's 6 sees the prompt and itself, never a's tokens
                       [1, 0, 0, 0, 1, 1]]
    # a: position 1 scores 7 (column 1), 2 scores 8; b: its 6 (flat 4) scores 9 (column 1)
    assert packing.scored.tolist() == [1, 2, 4] and packing.targets.tolist() == [7, 8, 9]
    assert list(zip(packing.rows.tolist(), packing.columns.tolist(), strict=True)) == [(0, 1), (0, 2), (1, 1)]


# -- same numbers as every sample whole ---------------------------------------------------------------
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_shared_prompts_give_the_padded_logprobs_entropy_and_gradients(attention):
    model = make_trainer(make_config()).model
    model.config._attn_implementation = attention
    assert supports_prompt_sharing(model)
    items = group_items(0)
    units = share_prompts(items, token_budget=10**6)
    ordered = [x for unit in units for x in unit.items]
    results = []
    for batch in (collate(ordered, 0, "cpu"), collate_packed(units, 0, "cpu", chunk_tokens=7)):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = token_logprobs(model, batch, temperature=0.8, with_entropy=True)
        (logprobs * batch.mask * batch.advantages[:, None]).sum().backward()
        results.append((logprobs * batch.mask, entropy * batch.mask, grads(model)))
    (old_lp, old_entropy, old_grads), (new_lp, new_entropy, new_grads) = results
    packing = batch.packing
    assert packing is not None and packing.attention_mask is not None
    assert packing.input_ids.numel() < sum(len(x) for x in items)  # the prompts held once
    torch.testing.assert_close(new_lp, old_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(new_entropy, old_entropy, rtol=0, atol=1e-5)
    assert float(old_lp.detach().abs().sum()) > 0
    assert_relatively_close(new_grads, old_grads)


def group_episodes(step: int, groups: int = 3, repeat: int = 4) -> list:
    """Each group's episodes answer the same prompt (as a GRPO group's do)."""
    rng = random.Random(step)
    episodes = []
    for g in range(groups):
        prompt = [rng.randrange(3, 300) for _ in range(rng.randint(4, 10))]
        for r in range(repeat):
            response = [rng.randrange(3, 300) for _ in range(rng.randint(2, 8))]
            mask = [1] * len(response)
            sample = Sample(prompt_ids=prompt, response_ids=response, loss_mask=mask,
                            logprobs=[-rng.random() * 3 for _ in mask])
            episodes.append(episode(f"s{step}g{g}", r, rng.choice([0.0, 0.5, 1.0]), [sample]))
    return episodes


@pytest.mark.parametrize("extra", [{}, {"lora_rank": 4, "lora_alpha": 8}])
def test_a_step_with_shared_prompts_trains_the_same_weights(extra):
    """Two steps, two epochs (a scoring pass), a KL penalty, several micro-batches: the same weights and
    metrics with the prompts shared as with every sample whole, on fewer tokens."""
    outcomes = []
    for share in (False, True):
        config = make_config(local={"share_prompts": share, "micro_batch_tokens": 80, "ppo_epochs": 2, **extra},
                             algorithm={"kl_coef": 0.1}, rollout={"temperature": 0.8})
        trainer = make_trainer(config)
        metrics = [trainer.step(group_episodes(step)) for step in range(2)]
        outcomes.append((parameters(trainer.model), metrics))
    (whole, whole_metrics), (shared, shared_metrics) = outcomes
    for name in whole:
        torch.testing.assert_close(shared[name], whole[name], rtol=0, atol=1e-5)
    for old, new in zip(whole_metrics, shared_metrics, strict=True):
        for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm"):
            assert new[key] == pytest.approx(old[key], rel=1e-4, abs=1e-6), key
        assert new["train/tokens"] == old["train/tokens"]  # the samples' tokens, as before
        assert old["train/model_tokens"] == old["train/tokens"]
        assert new["train/model_tokens"] < 0.8 * old["train/model_tokens"]  # what the model ran on


# -- where it is off ----------------------------------------------------------------------------------
def test_attention_without_custom_masks_runs_every_sample_whole():
    trainer = make_trainer(make_config(local={"update_threads": 1}))  # (one micro-batch: every one shares)
    assert trainer._shares_prompts
    config = trainer.model.config
    for attention in ("flash_attention_2", "flex_attention"):
        config._attn_implementation = attention
        assert not trainer._shares_prompts
    config._attn_implementation = "sdpa"
    config.layer_types = ["full_attention", "sliding_attention"]  # a custom mask would undo the window
    assert not trainer._shares_prompts
    config.layer_types = ["full_attention"] * 2
    batches = trainer._micro_batches(group_items(1))
    assert all(batch.packing.attention_mask is not None for batch in batches)
    off = make_trainer(make_config(local={"share_prompts": False, "update_threads": 1}))
    assert all(batch.packing.attention_mask is None for batch in off._micro_batches(group_items(1)))
