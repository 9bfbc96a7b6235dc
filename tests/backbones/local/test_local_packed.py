"""The packed, chunked update (issue 38) against the padded one, on a real tiny transformers Qwen2 model."""

from __future__ import annotations

import random

import pytest

from agenttune.backbones.local.batching import TrainItem
from agenttune.errors import UserError

torch = pytest.importorskip("torch")

from test_local_grpo import make_config, make_trainer, parameters, step_episodes  # noqa: E402

from agenttune.backbones.local.chunked_logprobs import chunked_logprobs  # noqa: E402
from agenttune.backbones.local.logprobs import collate, collate_packed, token_logprobs  # noqa: E402
from agenttune.backbones.local.packing import balanced_micro_batches, pack  # noqa: E402
from agenttune.backbones.local.prompt_sharing import alone  # noqa: E402


def random_items(seed: int, count: int = 5, vocab: int = 300, longest: int = 40) -> list[TrainItem]:
    """Samples of different lengths with a prompt (mask 0) and a response of trained and inserted tokens;
    the first is `longest` long, so that several of the others fit in a row of its width."""
    rng = random.Random(seed)
    items = []
    for index in range(count):
        length = longest if index == 0 else rng.randint(6, longest // 2)
        mask = [0] * 4 + [rng.choice([0, 1, 1]) for _ in range(length - 4)]
        mask[-1] = 1
        items.append(TrainItem([rng.randrange(3, vocab) for _ in range(length)], mask,
                               [-rng.random() for _ in range(length)], rng.choice([-1.0, 0.5, 1.0])))
    return items


def grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_relatively_close(got: dict, expected: dict, rtol: float = 1e-4) -> None:
    assert got.keys() == expected.keys() and expected
    for name, value in expected.items():
        scale = value.abs().max().clamp(min=1e-12)
        assert float((got[name] - value).abs().max() / scale) < rtol, name


# -- packing and balancing --------------------------------------------------------------------------
def test_micro_batches_are_balanced_by_tokens_and_keep_every_item_once():
    rng = random.Random(3)
    items = [TrainItem([1] * n, [0] + [1] * (n - 1), [0.0] * n, 1.0) for n in
             [rng.randint(5, 300) for _ in range(40)] + [700, 1000]]
    budget = 512
    groups = [[unit.items[0] for unit in group] for group in balanced_micro_batches(alone(items), budget)]
    assert sorted(id(item) for group in groups for item in group) == sorted(id(item) for item in items)
    loads = [sum(len(item) for item in group) for group in groups]
    assert [len(g[0]) for g in groups if len(g[0]) > budget] == [700, 1000]  # oversized: alone
    assert all(len(g) == 1 for g in groups if len(g[0]) > budget)
    regular = [load for group, load in zip(groups, loads, strict=True) if len(group[0]) <= budget]
    assert max(regular) <= budget
    total = sum(regular)
    assert len(regular) <= -(-total // budget) + 1  # the fewest micro-batches the budget allows, or one more
    assert max(regular) - min(regular) <= 300  # even: within one item's length


def test_packing_restarts_positions_and_scores_only_trained_targets():
    items = [TrainItem([5, 6, 7, 8], [0, 0, 1, 1], [0.0] * 4, 1.0), TrainItem([9, 10, 11], [0, 1, 0], [0.0] * 3, 1.0),
             TrainItem([12], [1], [0.0], 1.0)]
    packing = pack(alone(items), "cpu", pad_token_id=0)
    # rows as wide as the longest item, first fit longest first: [item 0], [item 1, item 2]
    assert packing.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert packing.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0]]
    # position 1 scores token 7, position 2 token 8, row 1's position 0 (flat 4) token 10
    assert packing.scored.tolist() == [1, 2, 4]
    assert packing.attention_mask is None  # nothing shared: the position ids keep samples apart
    assert packing.targets.tolist() == [7, 8, 10]
    assert list(zip(packing.rows.tolist(), packing.columns.tolist(), strict=True)) == [(0, 1), (0, 2), (1, 0)]
    unpacked = packing.unpack(torch.tensor([1.0, 2.0, 3.0]), torch.Size([3, 3]))
    assert unpacked.tolist() == [[0.0, 1.0, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    padded_end = pack(alone(items[1:]), "cpu", pad_token_id=0)  # width 3: two rows, the second padded
    assert padded_end.input_ids.tolist() == [[9, 10, 11], [12, 0, 0]]
    assert padded_end.position_ids.tolist() == [[0, 1, 2], [0, 0, 1]]  # the padding: a sample of its own


# -- packed vs padded on the tiny Qwen2 ---------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_entropy_and_gradients_equal_the_padded_ones(temperature):
    """Eight samples packed several to a row (block-diagonal attention) against eight padded rows."""
    model = make_trainer(make_config()).model
    items = random_items(0, count=8)
    results = []
    for batch in (collate(items, 0, "cpu"), collate_packed(alone(items), 0, "cpu", chunk_tokens=7)):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = token_logprobs(model, batch, temperature=temperature, with_entropy=True)
        (logprobs * batch.mask * batch.advantages[:, None]).sum().backward()
        results.append((logprobs * batch.mask, entropy * batch.mask, grads(model)))
    (old_lp, old_entropy, old_grads), (new_lp, new_entropy, new_grads) = results
    assert batch.packing is not None and batch.packing.input_ids.shape[0] < len(items)  # rows hold several
    torch.testing.assert_close(new_lp, old_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(new_entropy, old_entropy, rtol=0, atol=1e-5)
    assert float(old_entropy.sum()) > 0 and float(old_lp.detach().abs().sum()) > 0
    assert_relatively_close(new_grads, old_grads)


@pytest.mark.parametrize("extra", [{}, {"lora_rank": 4, "lora_alpha": 8}])
def test_a_packed_training_step_equals_a_padded_one(extra):
    """Loss, KL, entropy and the updated weights; with a KL penalty, two epochs (so a scoring pass of
    the old policy) over several micro-batches. (With mini_batches > 1 the two paths would split the
    step differently, since their micro-batches differ. One update thread: several would split the packed step
    into more micro-batches, test_update_threads.py.)"""
    outcomes = []
    for path in ("padded", "packed"):
        config = make_config(local={"update_path": path, "micro_batch_tokens": 60, "ppo_epochs": 2, "update_threads": 1,
                                    **extra},
                             algorithm={"kl_coef": 0.1}, rollout={"temperature": 0.8})
        trainer = make_trainer(config)
        before = parameters(trainer.model)
        metrics = [trainer.step(step_episodes(step)) for step in range(2)]
        outcomes.append((before, parameters(trainer.model), metrics))
    (before, padded, padded_metrics), (_, packed, packed_metrics) = outcomes
    changed = [name for name in padded if not torch.equal(padded[name], before[name])]
    assert changed and (not extra or all("lora_" in name for name in changed))
    for name in padded:  # 4 AdamW updates of ~lr = 1e-3 each; float noise of the attention kernels stays far below
        torch.testing.assert_close(packed[name], padded[name], rtol=0, atol=1e-5)
    for old, new in zip(padded_metrics, packed_metrics, strict=True):
        assert new["train/updates"] == old["train/updates"] == 2
        for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/logprob_mismatch"):
            assert new[key] == pytest.approx(old[key], rel=1e-4, abs=1e-6), key
        assert new["train/tokens"] == old["train/tokens"]
        assert new["train/micro_batches"] <= old["train/micro_batches"]


# -- chunked vs full logits ---------------------------------------------------------------------------
def reference_logprobs(hidden, head, targets, temperature):
    """The padded path's arithmetic on the full logits."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    normaliser = torch.logsumexp(logits, -1)
    logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - normaliser
    entropy = normaliser - (torch.softmax(logits, -1) * logits).sum(-1)
    return logprobs, entropy.detach()


def chunked_against_full(head: torch.nn.Module, temperature: float, chunk_tokens: int = 5) -> None:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, head.in_features, generator=generator, requires_grad=True)
    targets = torch.randint(0, head.out_features, (23,), generator=generator)
    upstream = torch.randn(23, generator=generator)
    results = []
    for compute in (lambda: reference_logprobs(hidden, head, targets, temperature),
                    lambda: chunked_logprobs(hidden, head, targets, temperature=temperature, with_entropy=True,
                                             chunk_tokens=chunk_tokens)):
        hidden.grad = None
        head.zero_grad(set_to_none=True)
        logprobs, entropy = compute()
        (logprobs * upstream).sum().backward()
        results.append((logprobs.detach(), entropy, {"hidden": hidden.grad.clone(), **grads(head)}))
    (full, full_entropy, full_grads), (chunked, chunked_entropy, chunked_grads) = results
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked_entropy, full_entropy, rtol=0, atol=1e-5)
    assert_relatively_close(chunked_grads, full_grads)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_logprobs_equal_the_full_logits(temperature, bias):
    torch.manual_seed(1)
    chunked_against_full(torch.nn.Linear(16, 97, bias=bias), temperature)


def test_chunked_logprobs_through_a_lora_adapted_head():
    """A LoRA lm_head is no plain Linear: it is applied per chunk under checkpointing, same values."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(2)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(16, 97, bias=False)

        def forward(self, hidden):
            return self.lm_head(hidden)

    adapted = peft.get_peft_model(Head(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head"]))
    head = adapted.base_model.model.lm_head
    torch.nn.init.normal_(head.lora_B["default"].weight)  # B starts at 0: make the adapter matter
    assert type(head) is not torch.nn.Linear
    head.in_features, head.out_features = 16, 97
    chunked_against_full(head, 0.7)


def test_the_frozen_head_of_a_lora_model_gets_no_gradient():
    """With LoRA on all linear layers, lm_head (tied to the embedding) stays frozen: no [V, H] gradient."""
    pytest.importorskip("peft")
    trainer = make_trainer(make_config(local={"lora_rank": 4}))
    items = random_items(1, count=2)
    batch = collate_packed(alone(items), 0, "cpu")
    logprobs, _ = token_logprobs(trainer.model, batch)
    (logprobs * batch.mask).sum().backward()
    produced = grads(trainer.model)
    assert produced and all("lora_" in name for name in produced)


def test_a_model_that_transforms_its_logits_is_refused_with_a_hint():
    trainer = make_trainer(make_config())
    trainer.model.config.final_logit_softcapping = 30.0
    with pytest.raises(UserError, match="update_path: padded"):
        token_logprobs(trainer.model, collate_packed(alone(random_items(2, count=1)), 0, "cpu"))


def test_packing_needs_attention_that_keeps_samples_apart(monkeypatch):
    """Without transformers' packed-sequence mask, sdpa would let samples attend to each other: refused."""
    from transformers import masking_utils

    trainer = make_trainer(make_config())
    batch = collate_packed(alone(random_items(3, count=4)), 0, "cpu")
    assert batch.packing is not None and batch.packing.shared_rows
    monkeypatch.delattr(masking_utils, "find_packed_sequence_indices")
    with pytest.raises(UserError, match="update_path: padded"):
        token_logprobs(trainer.model, batch)


# -- the rest of the update ---------------------------------------------------------------------------
def test_cpu_offloaded_adamw_gives_the_same_update():
    results = []
    for offload in (False, True):
        trainer = make_trainer(make_config(local={"optimizer_offload": offload}, trainer={"learning_rate": 1e-2}))
        for step in range(3):
            trainer.step(step_episodes(step))
        results.append((parameters(trainer.model), trainer.state_dict()))
    (plain, plain_state), (offloaded, offloaded_state) = results
    assert type(make_trainer(make_config(local={"optimizer_offload": True})).optimizer).__name__ == "CPUOffloadAdamW"
    for name in plain:
        torch.testing.assert_close(offloaded[name], plain[name], rtol=0, atol=1e-6)
    moments = [state["exp_avg"] for state in offloaded_state["optimizer"]["state"].values()]
    assert moments and all(m.device.type == "cpu" and m.abs().sum() > 0 for m in moments)
    assert len(moments) == len(plain_state["optimizer"]["state"])


def test_gradient_checkpointing_auto_turns_on_when_the_activations_would_not_fit():
    from agenttune.backbones.local.policy import activation_bytes, checkpointing_wanted

    small = make_config(local={"gradient_checkpointing": "auto"})
    model = make_trainer(small).model
    assert not model.is_gradient_checkpointing and not checkpointing_wanted(small, model, torch.device("cpu"))
    huge = make_config(local={"gradient_checkpointing": "auto", "micro_batch_tokens": 10**9})
    assert activation_bytes(model.config, 10**9) > 10**12
    assert checkpointing_wanted(huge, model, torch.device("cpu"))
