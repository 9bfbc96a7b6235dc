"""tinker-cookbook's RL loop (`tinker_cookbook.rl.train.main`) learns a small offline task through the server.

The environment is our own, written in the cookbook's interfaces (Env, EnvGroupBuilder, RLDataset,
RLDatasetBuilder): the prompt "User: Say even tokens." in the cookbook's `role_colon` renderer, one turn of
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

import asyncio
import json
from collections.abc import Sequence

import chz
import pytest
import tinker
import torch
from tinker_cookbook import renderers
from tinker_cookbook.rl import train
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.tokenizer_utils import get_tokenizer

MODEL = "tiny://default"  # the server's --model (conftest.py)
GROUP_SIZE = 8
GROUPS_PER_BATCH = 2
STEPS = 12
LEARNING_RATE = 3e-2


class EvenTokensEnv(Env):
    def __init__(self, renderer: renderers.Renderer):
        self.renderer = renderer

    async def initial_observation(self):
        prompt = self.renderer.build_generation_prompt([{"role": "user", "content": "Say even tokens."}])
        return prompt, self.renderer.get_stop_sequences()

    async def step(self, action, *, extra=None) -> StepResult:
        reward = sum(token % 2 == 0 for token in action) / max(len(action), 1)
        return StepResult(reward=reward, episode_done=True, next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=self.renderer.get_stop_sequences())


@chz.chz
class EvenTokensGroupBuilder(EnvGroupBuilder):
    renderer_name: str
    model_name: str

    async def make_envs(self) -> Sequence[Env]:
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name))
        return [EvenTokensEnv(renderer) for _ in range(GROUP_SIZE)]

    def logging_tags(self) -> list[str]:
        return ["even_tokens"]


class EvenTokensDataset(RLDataset):
    def __init__(self, builder: EnvGroupBuilder, steps: int):
        self.builder, self.steps = builder, steps

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [self.builder] * GROUPS_PER_BATCH

    def __len__(self) -> int:
        return self.steps


@chz.chz
class EvenTokensDatasetBuilder(RLDatasetBuilder):
    renderer_name: str = "role_colon"
    model_name: str = MODEL
    steps: int = STEPS
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        builder = EvenTokensGroupBuilder(renderer_name=self.renderer_name, model_name=self.model_name)
        return EvenTokensDataset(builder, self.steps), None


def run_rl_loop(base_url: str, log_path, *, loss_fn: str = "importance_sampling", steps: int = STEPS,
                learning_rate: float = LEARNING_RATE) -> list[float]:
    """The mean reward of each iteration, as the cookbook logs it (metrics.jsonl's env/all/reward/total)."""
    config = train.Config(
        learning_rate=learning_rate, dataset_builder=EvenTokensDatasetBuilder(steps=steps), model_name=MODEL,
        recipe_name="agenttune_even_tokens", max_tokens=8, log_path=str(log_path), renderer_name="role_colon",
        base_url=base_url, loss_fn=loss_fn, lora_rank=8, eval_every=0, save_every=0, num_groups_to_log=0,
        rollout_json_export=False)
    asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "env/all/reward/total" in row]
    return [row["env/all/reward/total"] for row in sorted(rows, key=lambda row: row["step"])]


@pytest.mark.slow
def test_the_cookbook_rl_loop_learns_through_the_server(cookbook_server, tmp_path):
    torch.manual_seed(0)  # the server runs in this process: its first sampling draws
    rewards = run_rl_loop(cookbook_server, tmp_path / "rl")
    print("rewards", rewards)
    assert len(rewards) == STEPS
    assert sum(rewards[-3:]) / 3 >= rewards[0] + 0.3, rewards
