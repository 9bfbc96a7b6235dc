"""tinker-cookbook's supervised loop (`tinker_cookbook.supervised.train.main`) fits a small dataset
through the server.

The dataset is our own, in the cookbook's interfaces (SupervisedDataset, SupervisedDatasetBuilder): 16
one-turn conversations "User: What is A plus B?" / "Assistant: C" (A odd, B even, both below 8), rendered
by the cookbook's `role_colon` renderer and turned into datums by its `conversation_to_datum` (loss on the
assistant's reply only). The loop sends `cross_entropy` forward_backward and Adam optim_step requests
through the real `tinker` SDK; its own logged `train_mean_nll` falls.

Measured (4 epochs of 4 batches, lr 5e-3 constant, LoRA rank 8, 2 cores; torch.manual_seed 0, 1, 2 — the
server runs in the test's process), the mean train_mean_nll of the first epoch -> the last epoch:
5.768 -> 1.476 (x0.26), 5.599 -> 1.843 (x0.33), 5.741 -> 1.135 (x0.20); asserted: at most x0.5.
(At lr 1e-2: x0.32, x0.43, x0.32.)
"""

from __future__ import annotations

import asyncio
import json

import chz
import pytest
import tinker
import torch
from tinker_cookbook import renderers
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import conversation_to_datum
from tinker_cookbook.supervised.types import SupervisedDataset, SupervisedDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

MODEL = "tiny://default"  # the server's --model (conftest.py)
BATCH_SIZE = 4
EPOCHS = 4
LEARNING_RATE = 5e-3
PAIRS = [(a, b) for a in range(1, 9, 2) for b in range(0, 8, 2)]  # 16 questions, sums from 1 to 13


class AdditionDataset(SupervisedDataset):
    def __init__(self, data: list[tinker.Datum]):
        self.data = data

    def get_batch(self, index: int) -> list[tinker.Datum]:
        return self.data[index * BATCH_SIZE:(index + 1) * BATCH_SIZE]

    def __len__(self) -> int:
        return len(self.data) // BATCH_SIZE

    def set_epoch(self, seed: int = 0) -> None:
        pass  # the same order every epoch: the loss compares like with like


@chz.chz
class AdditionDatasetBuilder(SupervisedDatasetBuilder):
    model_name: str = MODEL
    renderer_name: str = "role_colon"

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name))
        conversations = [[{"role": "user", "content": f"What is {a} plus {b}?"},
                          {"role": "assistant", "content": str(a + b)}] for a, b in PAIRS]
        data = [conversation_to_datum(conversation, renderer, max_length=64,
                                      train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
                for conversation in conversations]
        return AdditionDataset(data), None


@pytest.mark.slow
def test_the_cookbook_supervised_loop_lowers_the_loss_through_the_server(cookbook_server, tmp_path):
    torch.manual_seed(0)  # the server runs in this process: its LoRA initialisation
    nll = run_supervised_loop(cookbook_server, tmp_path / "sft")
    print("train_mean_nll", [round(value, 3) for value in nll])
    steps_per_epoch = len(PAIRS) // BATCH_SIZE
    assert len(nll) == EPOCHS * steps_per_epoch
    first, last = sum(nll[:steps_per_epoch]) / steps_per_epoch, sum(nll[-steps_per_epoch:]) / steps_per_epoch
    assert last <= 0.5 * first, nll


def run_supervised_loop(base_url: str, log_path, *, learning_rate: float = LEARNING_RATE) -> list[float]:
    """The training loss of each step, as the cookbook logs it (metrics.jsonl's train_mean_nll)."""
    config = train.Config(
        log_path=str(log_path), model_name=MODEL, recipe_name="agenttune_addition",
        renderer_name="role_colon", dataset_builder=AdditionDatasetBuilder(), learning_rate=learning_rate,
        lr_schedule="constant", num_epochs=EPOCHS, lora_rank=8, base_url=base_url, save_every=0,
        eval_every=0, infrequent_eval_every=0)
    asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    rows = sorted((row for row in rows if "train_mean_nll" in row), key=lambda row: row["step"])
    return [row["train_mean_nll"] for row in rows]
