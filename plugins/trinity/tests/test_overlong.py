"""DAPO's overlong reward shaping on the trinity backbone. Trinity-RFT 0.6.0 has the rule only inside
its math reward function (`math_dapo_reward`), which agenttune's judge replaces, so agenttune's
workflow subtracts the penalty from the reward it hands Trinity; it equals that function's
`compute_overlong_penalty` on random lengths, the edges included."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from agenttune_trinity.experiences import OVERLONG_PENALTY, episode_experiences, group_experiences
from agenttune_trinity.launch import (
    check_and_update,
    load_trinity_config,
    write_tasksets,
    write_trinity_config,
)
from agenttune_trinity.translation import TrinityPaths, trinity_config
from fake_vllm import FakeVLLMServer
from test_workflow import Scripted, run_the_40_plus_2_group

from agenttune.plugin_api import (
    Episode,
    EpisodeStatus,
    OverlongShapingOptions,
    Sample,
    Task,
    prepare_run,
    resolve,
)

MAX_LENGTH, BUFFER, FACTOR = 64, 16, 0.7


def one_call_episode(length: int, reward: float, index: int = 0) -> Episode:
    sample = Sample(agent="default", prompt_ids=[11, 12], response_ids=[100 + t % 50 for t in range(length)],
                    loss_mask=[1] * length, logprobs=[-0.5] * length, num_calls=1)
    return Episode(episode_id=f"e{index}", task=Task(task_id=f"t{index}", query="q"), group_id="g",
                   repeat_index=index, reward=reward, samples=[sample])


def test_the_penalty_equals_trinitys_dapo_reward_function_on_random_lengths():
    import torch
    from trinity.common.rewards.dapo_reward import MathDAPORewardFn

    theirs = MathDAPORewardFn(enable_overlong_penalty=True, penalty_factor=FACTOR, max_response_length=MAX_LENGTH,
                              cache_length=BUFFER)
    options = OverlongShapingOptions(enable=True, max_length=MAX_LENGTH, buffer=BUFFER, penalty=FACTOR)
    rng = random.Random(37)
    start = MAX_LENGTH - BUFFER
    lengths = [1, start - 1, start, start + 1, MAX_LENGTH - 1, MAX_LENGTH, MAX_LENGTH + 1, 3 * MAX_LENGTH]
    lengths += [rng.randint(1, 2 * MAX_LENGTH) for _ in range(40)]
    for length in lengths:
        score = rng.uniform(-1, 1)
        [experience] = episode_experiences(one_call_episode(length, score), run_id=0, pad_token_id=0, overlong=options)
        expected = score + theirs.compute_overlong_penalty(torch.zeros(length))
        assert experience.reward == pytest.approx(expected, abs=1e-6), length
    [at_limit] = episode_experiences(one_call_episode(MAX_LENGTH, 1.0), run_id=0, pad_token_id=0, overlong=options)
    assert at_limit.reward == pytest.approx(1.0 - FACTOR)


def test_the_groups_penalty_is_a_step_metric_and_failures_are_not_shaped():
    options = OverlongShapingOptions(enable=True, max_length=MAX_LENGTH, buffer=BUFFER, penalty=FACTOR)
    failed = one_call_episode(MAX_LENGTH, 0.0, 1)
    failed.status = EpisodeStatus.TIMEOUT
    experiences = group_experiences([one_call_episode(MAX_LENGTH, 1.0), failed, one_call_episode(10, 1.0, 2)],
                                    run_id_base=0, pad_token_id=0, overlong=options)
    assert [e.reward for e in experiences] == pytest.approx([1.0 - FACTOR, 1.0])
    assert experiences[-1].metrics[OVERLONG_PENALTY] == pytest.approx(FACTOR)
    unshaped = group_experiences([one_call_episode(MAX_LENGTH, 1.0)], run_id_base=0, pad_token_id=0)
    assert unshaped[0].reward == 1.0 and OVERLONG_PENALTY not in unshaped[0].metrics


async def test_the_workflow_shapes_training_rewards(make_config, tmp_path: Path, tiny_model_path, tiny_tokenizer):
    """The calculator agent's two calls generate more than max_length tokens: the right answer's reward
    loses the whole penalty, the wrong one's too; the rollout log keeps the judge's rewards."""
    config = make_config("algorithm.overlong_shaping.enable=true", "algorithm.overlong_shaping.max_length=8",
                         "algorithm.overlong_shaping.buffer=4", "algorithm.overlong_shaping.penalty=0.25")
    run = prepare_run(config, tmp_path / "run")
    paths = TrinityPaths.for_run(run.run_dir, str(tiny_model_path))
    cfg = load_trinity_config(write_trinity_config(trinity_config(config, paths), run.run_dir))
    write_tasksets(resolve(config), config, Path(paths.tasks))
    check_and_update(cfg)

    experiences = await run_the_40_plus_2_group(cfg, FakeVLLMServer(tiny_tokenizer, Scripted()), repeat=2)

    generated = [int(e.action_mask.sum()) for e in experiences]
    assert all(tokens > 8 for tokens in generated)
    assert sorted(e.reward for e in experiences) == pytest.approx([-0.25, 0.75])
    assert experiences[-1].metrics[OVERLONG_PENALTY] == pytest.approx(0.5)
