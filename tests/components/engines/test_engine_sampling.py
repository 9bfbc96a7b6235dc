"""The `hf` engine's batched sampler against independent computations on random logits."""

import math

import pytest
import torch

from agenttune.components.engines.base import SamplingParams
from agenttune.components.engines.sampling import BatchSampler, seeded_generator, to_host

VOCAB = 12


def sampler(*samplings: SamplingParams, generators=None) -> BatchSampler:
    return BatchSampler.for_rows(samplings, generators or [None] * len(samplings), vocab_size=VOCAB, device="cpu")


def allowed_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """What a row should sample from, computed the slow, obvious way: scale, keep the top-k, keep the
    most likely tokens until their mass reaches top-p, renormalise."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    order = sorted(range(VOCAB), key=lambda token: -probs[token].item())
    if 0 < params.top_k < VOCAB:
        order = order[:params.top_k]
    kept, mass = [], 0.0
    for token in order:
        if mass >= params.top_p:
            break
        kept.append(token)
        mass += probs[token].item()
    kept_probs = torch.zeros(VOCAB)
    kept_probs[kept] = probs[kept]
    return kept_probs / kept_probs.sum()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=6, top_p=0.7),
], ids=["plain", "top_k", "top_p", "both"])
def test_sampled_frequencies_follow_the_filtered_distribution(params):
    torch.manual_seed(0)
    logits = torch.randn(VOCAB) * 2
    rows = 20_000
    tokens, logprobs = sampler(*[params] * rows).sample(logits.expand(rows, VOCAB).clone())
    expected = allowed_distribution(logits, params)
    observed = torch.bincount(tokens, minlength=VOCAB).float() / rows
    assert torch.all(observed[expected == 0] == 0)  # never a filtered token
    # Each frequency within 5 standard errors of its probability (a binomial's spread).
    spread = 5 * torch.sqrt(expected * (1 - expected) / rows) + 1e-9
    assert torch.all((observed - expected).abs() <= spread), (observed, expected)
    # Logprobs: temperature-scaled, before filtering, of the token drawn.
    assert torch.allclose(logprobs, torch.log_softmax(logits / params.temperature, dim=-1)[tokens], atol=1e-6)


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    torch.manual_seed(1)
    logits = torch.randn(4, VOCAB)
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
    tokens, logprobs = sampler(greedy, sampled, greedy, sampled).sample(logits.clone())
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()
    assert math.isclose(logprobs[0].item(), torch.log_softmax(logits[0], -1).max().item(), abs_tol=1e-6)


def test_a_seeded_row_draws_the_same_tokens_in_any_batch():
    torch.manual_seed(2)
    logits = torch.randn(6, VOCAB)
    seeded = SamplingParams(temperature=1.0, seed=7)

    def draws(row: int, rows: int) -> list[int]:
        generators = [None] * rows
        generators[row] = seeded_generator(seeded, "cpu")
        params = [SamplingParams(temperature=1.0)] * rows
        params[row] = seeded
        batch = sampler(*params, generators=generators)
        batch_logits = torch.randn(rows, VOCAB)
        batch_logits[row] = logits[0]
        return [batch.sample(batch_logits.clone())[0][row].item() for _ in range(20)]

    alone = draws(0, 1)
    assert draws(3, 6) == alone and draws(1, 2) == alone
    assert len(set(alone)) > 1  # it did sample, not take the argmax every time


def test_the_host_copy_keeps_large_token_ids_and_logprobs_exact():
    tokens = torch.tensor([0, 151_642, 2**31 - 1])
    logprobs = torch.tensor([-0.1, -12.345678, -1e-7])
    forced = torch.tensor([True, False, True])
    ids, values, flags = to_host(tokens, logprobs, forced)
    assert ids == [0, 151_642, 2**31 - 1] and all(isinstance(token, int) for token in ids)
    assert values == logprobs.tolist()
    assert flags == [True, False, True]
    assert to_host(tokens, logprobs, None)[2] == []


def test_tokens_a_guide_forbids_are_never_drawn():
    torch.manual_seed(3)
    logits = torch.randn(5_000, VOCAB)
    logits[:, [0, 1, 2, 4, 5, 6, 7, 8, 10, 11]] = float("-inf")  # a grammar allows tokens 3 and 9 only
    tokens, _ = sampler(*[SamplingParams(temperature=1.0)] * 5_000).sample(logits)
    assert set(tokens.tolist()) == {3, 9}


def test_rounding_at_the_end_of_the_distribution_falls_back_to_a_possible_token():
    from agenttune.components.engines.sampling import _inverse_cdf

    probs = torch.tensor([[0.0, 0.7, 0.3, 0.0], [0.5, 0.5, 0.0, 0.0]])
    at_the_top = torch.ones(2, 1, dtype=torch.float64)  # uniform x total lands past every token
    assert _inverse_cdf(probs, at_the_top).tolist() == [1, 0]
    at_the_bottom = torch.zeros(2, 1, dtype=torch.float64)
    assert _inverse_cdf(probs, at_the_bottom).tolist() == [1, 0]  # zero-probability leading tokens skipped
