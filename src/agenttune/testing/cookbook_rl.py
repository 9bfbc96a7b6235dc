"""A small offline task in tinker-cookbook's RL interfaces, learned through `agenttune tinker serve`.

The prompt "User: Say even tokens." in the cookbook's `role_colon` renderer, one turn of up to 8 sampled
tokens, reward = the share of the reply's tokens whose id is even (0.5 for an untrained model, in
expectation). `run_rl_loop` runs the cookbook's own loop (`tinker_cookbook.rl.train.main`) on it: each
iteration save_weights_and_get_sampling_client, groups of rollouts sampled through the server, rewards
centred per group, one forward_backward and an Adam optim_step, all through the real `tinker` SDK.
tests/entrypoints/tinker_cookbook and bench/tinker_api.py use it; it needs tinker-cookbook installed
(`nox -s tinker_cookbook` lists what it imports).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import chz
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.rl import train
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.tokenizer_utils import get_tokenizer

GROUP_SIZE = 8
GROUPS_PER_BATCH = 2


class EvenTokensEnv(Env):
    def __init__(self, renderer: renderers.Renderer):
        self.renderer = renderer

    async def initial_observation(self) -> Any:
        prompt = self.renderer.build_generation_prompt([{"role": "user", "content": "Say even tokens."}])
        return prompt, self.renderer.get_stop_sequences()

    async def step(self, action: Any, *, extra: Any = None) -> StepResult:
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
    model_name: str
    steps: int
    renderer_name: str = "role_colon"

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        builder = EvenTokensGroupBuilder(renderer_name=self.renderer_name, model_name=self.model_name)
        return EvenTokensDataset(builder, self.steps), None


@contextmanager
def offline_cookbook(model: str, tokenizer: Callable[[], Any]) -> Iterator[None]:
    """The cookbook set up for a server on this machine: `model` (an agenttune name such as
    `tiny://default`, not a hub id) maps to the tokenizer `tokenizer()` returns, and no model prices are looked up on the web."""
    from tinker_cookbook import tokenizer_utils
    from tinker_cookbook.utils import cost_estimation

    pricing = cost_estimation.load_model_pricing
    cost_estimation.load_model_pricing = lambda *args, **kwargs: None
    tokenizer_utils.register_tokenizer(model, tokenizer)
    try:
        yield
    finally:
        tokenizer_utils.unregister_tokenizer(model)
        cost_estimation.load_model_pricing = pricing


def run_rl_loop(base_url: str, log_path: Path, *, model: str, steps: int, learning_rate: float,
                loss_fn: str = "importance_sampling", lora_rank: int = 8) -> list[float]:
    """The mean reward of each iteration, as the cookbook logs it (metrics.jsonl's env/all/reward/total)."""
    config = train.Config(
        learning_rate=learning_rate, dataset_builder=EvenTokensDatasetBuilder(model_name=model, steps=steps),
        model_name=model, recipe_name="agenttune_even_tokens", max_tokens=8, log_path=str(log_path),
        renderer_name="role_colon", base_url=base_url, loss_fn=loss_fn, lora_rank=lora_rank, eval_every=0,
        save_every=0, num_groups_to_log=0, rollout_json_export=False)
    asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "env/all/reward/total" in row]
    return [row["env/all/reward/total"] for row in sorted(rows, key=lambda row: row["step"])]
