"""Episodes → Experiences, and what Trinity's multi-step GRPO makes of them."""

from __future__ import annotations

import math

import pytest
from agenttune_trinity.experiences import episode_experiences, group_experiences

from agenttune.plugin_api import Episode, EpisodeStatus, Sample, Task

PAD = 0


def sample(prompt: list[int], response: list[int], mask: list[int], *, trainable: bool = True) -> Sample:
    logprobs = [-0.5 if flag else 0.0 for flag in mask]
    return Sample(prompt_ids=prompt, response_ids=response, loss_mask=mask, logprobs=logprobs, trainable=trainable)


def episode(index: int, reward: float, samples: list[Sample], status: EpisodeStatus = EpisodeStatus.OK) -> Episode:
    return Episode(episode_id=f"g-{index}", task=Task(task_id="t1", query="q"), group_id="g", repeat_index=index,
                   reward=reward, status=status, samples=samples)


def test_each_trainable_sample_is_one_experience_of_the_run():
    two_samples = episode(0, 1.0, [sample([1, 2], [3, 4, 5], [1, 0, 1]), sample([6], [7, 8], [1, 1])])
    experiences = episode_experiences(two_samples, run_id=7, pad_token_id=PAD)
    assert [(e.eid.run, e.eid.step) for e in experiences] == [(7, 0), (7, 1)]
    first = experiences[0]
    assert first.tokens.tolist() == [1, 2, 3, 4, 5] and first.prompt_length == 2
    assert first.action_mask.tolist() == [True, False, True]
    assert first.logprobs.tolist() == [-0.5, 0.0, -0.5]
    assert {e.reward for e in experiences} == {1.0}


def test_failed_episodes_give_nothing_and_untrained_ones_a_masked_placeholder():
    crashed = episode(0, 0.0, [sample([1], [2], [1])], status=EpisodeStatus.WORKFLOW_ERROR)
    assert episode_experiences(crashed, run_id=0, pad_token_id=PAD) == []
    untrained = episode(1, 0.5, [sample([1, 2, 3], [4], [1], trainable=False)])
    [placeholder] = episode_experiences(untrained, run_id=1, pad_token_id=PAD)
    assert placeholder.tokens.tolist() == [1, 2, 3, PAD] and placeholder.prompt_length == 3
    assert placeholder.action_mask.tolist() == [False] and placeholder.reward == 0.5


def test_trinitys_multi_step_grpo_broadcasts_each_runs_advantage_to_its_samples():
    from trinity.algorithm import ADVANTAGE_FN

    episodes = [
        episode(0, 1.0, [sample([1], [2, 3], [1, 1]), sample([4], [5], [1])]),  # two samples, one run
        episode(1, 0.0, [sample([1], [6, 7], [1, 0])]),
        episode(2, 0.0, [sample([1], [2], [1])], status=EpisodeStatus.TIMEOUT),  # left out
    ]
    experiences = group_experiences(episodes, run_id_base=10, pad_token_id=PAD)
    assert len(experiences) == 3
    assert [e.metrics != {} for e in experiences] == [False, False, True]
    assert experiences[-1].metrics["failure_rate"] == pytest.approx(1 / 3)
    for experience in experiences:  # what Trinity's runner sets
        experience.eid.batch, experience.eid.task = 1, 0

    advantage_fn = ADVANTAGE_FN.get("step_wise_grpo")(**ADVANTAGE_FN.get("step_wise_grpo").default_args())
    processed, _ = advantage_fn(experiences)
    by_run = {}
    for experience in processed:
        by_run.setdefault(experience.eid.run, []).append(experience.advantages.tolist())
    spread = 1 / math.sqrt(0.5)  # rewards 1 and 0: mean 0.5, sample std sqrt(0.5)
    assert by_run[10] == [pytest.approx([0.5 * spread] * 2, rel=1e-4), pytest.approx([0.5 * spread], rel=1e-4)]
    assert by_run[11] == [pytest.approx([-0.5 * spread, 0.0], rel=1e-4)]  # masked token: no advantage


def test_a_sample_over_the_limits_is_split_at_call_boundaries_with_full_prompts():
    """Three calls (generated 1-runs) with context between; a 4-token response limit (issue 24)."""
    merged = sample([1, 2], [10, 11, 90, 12, 13, 91, 92, 14, 15, 16, 17, 18], [1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1])
    long_run = episode(0, 1.0, [merged])
    experiences = episode_experiences(long_run, run_id=3, pad_token_id=PAD, limits=(20, 4))
    # calls: [10 11] [12 13] [14..18]: with the context between them the first two are 5 tokens, so each
    # is a part of its own (the second prompted with the first); the third (5 tokens) fits in no part
    assert [(e.tokens.tolist(), e.prompt_length) for e in experiences] == [
        ([1, 2, 10, 11], 2), ([1, 2, 10, 11, 90, 12, 13], 5)]
    assert long_run.metrics["truncation/samples_split"] == 1 and long_run.metrics["truncation/calls_dropped"] == 1
    experiences = episode_experiences(long_run, run_id=3, pad_token_id=PAD, limits=(20, 5))
    assert [(e.tokens.tolist(), e.prompt_length) for e in experiences] == [
        ([1, 2, 10, 11, 90, 12, 13], 2), ([1, 2, 10, 11, 90, 12, 13, 91, 92, 14, 15, 16, 17, 18], 9)]
    assert experiences[1].action_mask.tolist() == [True] * 5
