"""tinker-cookbook's RL loop (`tinker_cookbook.rl.train.main`) learns a small offline task through the server.

The environment is our own (agenttune/testing/cookbook_rl.py, which bench/tinker_api.py runs too), written in
the cookbook's interfaces (Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder): the prompt "User: Say even tokens." in the cookbook's `role_colon` renderer, one turn of
up to 8 sampled tokens, reward = the share of the reply's tokens whose id is even (0.5 for the untrained
tiny model, in expectation). Each iteration: save_weights_and_get_sampling_client, 2 groups of 8 rollouts
sampled through the server, rewards centred per group, one `importance_sampling` forward_backward and an Adam
optim_step — all through the real `tinker` SDK. The loss is named explicitly: `importance_sampling` is
`rl.train.Config`'s own default, but the cookbook's async mode and its math_rl, rubric and rl_loop recipes
default to `stable_reinforce`, which the server does not serve.

Measured (12 iterations, lr 3e-2, LoRA rank 8, 2 cores), the mean reward of iteration 0 -> the mean of
the last 3 iterations, torch.manual_seed 0..4 (the server runs in the test's process; the seed fixes the
first iteration only: later ones differ from run to run, the rollouts' requests reaching the server
concurrently):
0.469 -> 1.000, 0.523 -> 1.000, 0.570 -> 1.000, 0.516 -> 0.992, 0.453 -> 0.982 (rises of 0.43 to 0.53).
Asserted: a rise of at least 0.3, the issue's target. With 10 iterations, 3 runs rose by 0.43-0.53 but a
fourth (in `nox -s tinker_cookbook`) fell back from 0.90 to 0.63 and rose by only 0.24; with 8 iterations,
one run rose 0.53 -> 0.61: hence 12. (lr 2e-2, 14 iterations: rises of 0.43 to 0.55 in 5 runs.)
"""

from __future__ import annotations

import pytest
import torch

from agenttune.testing.cookbook_rl import run_rl_loop

MODEL = "tiny://default"  # the server's --model (conftest.py)
STEPS = 12
LEARNING_RATE = 3e-2


@pytest.mark.slow
def test_the_cookbook_rl_loop_learns_through_the_server(cookbook_server, tmp_path):
    torch.manual_seed(0)  # the server runs in this process: its first sampling draws
    rewards = run_rl_loop(cookbook_server, tmp_path / "rl", model=MODEL, steps=STEPS, learning_rate=LEARNING_RATE)
    print("rewards", rewards)
    assert len(rewards) == STEPS
    assert sum(rewards[-3:]) / 3 >= rewards[0] + 0.3, rewards
