"""DAPO's overlong reward shaping on the verl backbone: the penalty agenttune's agent loop subtracts
from the reward it hands verl equals what verl 0.9.1's own DAPO reward manager
(`verl.workers.reward_manager.dapo.DAPORewardManager`, which the agent loop bypasses) computes."""

from __future__ import annotations

import random

import pytest
from agenttune_verl.agent_loop import WorkerRuntime
from agenttune_verl.metrics_bridge import OVERLONG_PENALTY_SUM, bridge_step
from agenttune_verl.outputs import Limits, episode_outputs
from conftest import FINAL_ANSWER
from test_verl_agent_loop import SAMPLING, dataset_rows, prepared_run, trajectory, v1_worker  # noqa: F401

from agenttune.plugin_api import (
    Episode,
    EpisodeStatus,
    OverlongShapingOptions,
    RolloutLog,
    Sample,
    Task,
    read_records,
)

MAX_LENGTH, BUFFER, FACTOR = 64, 16, 0.7
PROMPT = [11, 12, 13]


@pytest.fixture
async def teardown_runtimes():
    yield
    await WorkerRuntime.close_all()


def verl_dapo_rewards(tokenizer, prompts: list[list[int]], responses: list[list[int]], scores: list[float], *,
                      max_resp_len: int, buffer: int, factor: float) -> list[float]:
    """verl's DAPO reward manager on these rows, each row's score given; the per-row reward it assigns."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    prompt_len = max(len(prompt) for prompt in prompts)
    pad = tokenizer.pad_token_id or 0
    prompt_ids = torch.tensor([[pad] * (prompt_len - len(p)) + p for p in prompts])  # left-padded, as verl does
    response_ids = torch.tensor([r + [pad] * (max_resp_len - len(r)) for r in responses])
    attention = torch.tensor([[0] * (prompt_len - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (max_resp_len - len(r))
                              for p, r in zip(prompts, responses, strict=True)])
    data = DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": attention},
        non_tensors={"data_source": np.array(["agenttune"] * len(prompts), dtype=object),
                     "reward_model": np.array([{"ground_truth": str(i)} for i in range(len(prompts))], dtype=object),
                     "extra_info": np.array([{} for _ in prompts], dtype=object)})
    manager = DAPORewardManager(
        tokenizer, num_examine=0, compute_score=lambda ground_truth, **_: scores[int(ground_truth)],
        max_resp_len=max_resp_len,
        overlong_buffer_cfg=OmegaConf.create({"enable": True, "len": buffer, "penalty_factor": factor, "log": False}))
    return manager(data).sum(dim=-1).tolist()


def one_call_episode(length: int, reward: float, index: int) -> Episode:
    sample = Sample(agent="default", prompt_ids=PROMPT, response_ids=[100 + t % 50 for t in range(length)],
                    loss_mask=[1] * length, logprobs=[-0.5] * length, num_calls=1)
    return Episode(episode_id=f"e{index}", task=Task(task_id=f"t{index}", query="q"), group_id=f"g{index}",
                   reward=reward, samples=[sample])


def agenttune_rewards(episodes: list[Episode], options: OverlongShapingOptions) -> list[float]:
    from agenttune_verl.engine import RequestStats

    rewards = []
    for episode in episodes:
        [output] = episode_outputs(episode, Limits(256, MAX_LENGTH), stats=RequestStats(), task_prompt=list,
                                   pad_token_id=0, keep_all_samples=True, step=1, can_drop=True, overlong=options)
        rewards.append(output.reward_score)
    return rewards


def test_the_penalty_equals_verls_dapo_reward_manager_on_random_lengths(tiny_tokenizer):
    rng = random.Random(37)
    start = MAX_LENGTH - BUFFER
    edges = [1, start - 1, start, start + 1, MAX_LENGTH - 1, MAX_LENGTH]  # the buffer's start, the length limit
    lengths = edges + [rng.randint(1, MAX_LENGTH) for _ in range(40)]
    scores = [rng.choice([0.0, 1.0, rng.uniform(-1, 1)]) for _ in lengths]
    episodes = [one_call_episode(length, score, i) for i, (length, score) in enumerate(zip(lengths, scores,
                                                                                            strict=True))]
    options = OverlongShapingOptions(enable=True, max_length=MAX_LENGTH, buffer=BUFFER, penalty=FACTOR)

    ours = agenttune_rewards(episodes, options)
    theirs = verl_dapo_rewards(tiny_tokenizer, [PROMPT] * len(lengths),
                               [e.samples[0].response_ids for e in episodes], scores,
                               max_resp_len=MAX_LENGTH, buffer=BUFFER, factor=FACTOR)

    assert ours == pytest.approx(theirs, abs=1e-6)
    penalties = dict(zip(lengths, (score - reward for score, reward in zip(scores, ours, strict=True)), strict=False))
    assert penalties[start] == 0.0 and penalties[start - 1] == 0.0  # no penalty up to the buffer's start
    assert penalties[start + 1] == pytest.approx(FACTOR / BUFFER)
    assert penalties[MAX_LENGTH] == pytest.approx(FACTOR)  # the whole penalty at the limit
    assert episodes[edges.index(MAX_LENGTH)].metrics["overlong_penalty"] == pytest.approx(FACTOR)


def test_off_failed_and_validation_rewards_are_the_judges():
    long_one = one_call_episode(MAX_LENGTH, 1.0, 0)
    failed = one_call_episode(MAX_LENGTH, 0.0, 1)
    failed.status = EpisodeStatus.TIMEOUT
    on = OverlongShapingOptions(enable=True, max_length=MAX_LENGTH, buffer=BUFFER, penalty=FACTOR)
    assert agenttune_rewards([long_one], OverlongShapingOptions()) == [1.0]  # shaping off (the default)
    assert agenttune_rewards([long_one.model_copy(deep=True)], on) == [pytest.approx(1.0 - FACTOR)]
    from agenttune_verl.engine import RequestStats

    # a failure cannot be dropped (validation, legacy trainer): its placeholder keeps the judge's reward
    [placeholder] = episode_outputs(failed, Limits(256, MAX_LENGTH), stats=RequestStats(), task_prompt=lambda: PROMPT,
                                    pad_token_id=0, keep_all_samples=True, step=1, overlong=on)
    assert placeholder.reward_score == 0.0 and "overlong_penalty" not in failed.metrics


async def test_the_agent_loop_shapes_training_rewards_as_verls_dapo_manager(prepared_run, tiny_tokenizer,  # noqa: F811
                                                                            monkeypatch, teardown_runtimes):
    """verl's own V1 worker runs the agent loop; the reward it stores is the judge's minus DAPO's penalty,
    the same number verl's DAPO reward manager gives the stored prompt and response; validation is unshaped."""
    answer_tokens = len(tiny_tokenizer.encode(FINAL_ANSWER, add_special_tokens=False)) + 1  # + <|im_end|>
    max_length, buffer = answer_tokens + 1, 4  # the answer lands inside the buffer: a partial penalty
    run = prepared_run("algorithm.overlong_shaping.enable=true", f"algorithm.overlong_shaping.max_length={max_length}",
                       f"algorithm.overlong_shaping.buffer={buffer}", "algorithm.overlong_shaping.penalty=0.5")
    verl_config, server, worker, stored = v1_worker(run, tiny_tokenizer, monkeypatch, [FINAL_ANSWER])
    row = dataset_rows(verl_config, verl_config.data.train_files, worker.tokenizer)[0]
    await worker._run_prompt({**row, "uid": "u", "global_steps": 2}, dict(SAMPLING),
                             trajectory=await trajectory(2, row["index"]))

    fields = [put["fields"][0] for put in stored["puts"]]
    assert len(fields) == 2
    rewards = [f["rm_scores"].sum().item() for f in fields]
    expected = 1.0 - 0.5 * (answer_tokens - (max_length - buffer)) / buffer
    assert rewards == pytest.approx([expected] * 2) and expected < 1.0
    theirs = verl_dapo_rewards(tiny_tokenizer, [f["prompts"].tolist() for f in fields],
                               [f["responses"].tolist() for f in fields], [1.0, 1.0],
                               max_resp_len=max_length, buffer=buffer, factor=0.5)
    assert rewards == pytest.approx(theirs)
    records = list(read_records(RolloutLog.for_run(run).path(2, "train")))
    assert {r.reward for r in records} == {1.0}  # the log keeps the judge's reward
    _, metrics = bridge_step({"step": 2, "data": {}}, RolloutLog.for_run(run))
    assert metrics[OVERLONG_PENALTY_SUM] == pytest.approx(2 * (1.0 - expected))

    row = dataset_rows(verl_config, verl_config.data.val_files, worker.tokenizer)[0]
    await worker._run_prompt({**row, "uid": "v", "global_steps": 2}, {**SAMPLING, "temperature": 0.0},
                             trajectory=await trajectory(2, row["index"], validate=True))
    assert stored["puts"][-1]["fields"][0]["rm_scores"].sum().item() == 1.0
