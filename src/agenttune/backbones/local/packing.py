"""Padding-free micro-batches: samples packed end to end into one row, balanced by token count.

The padded path (`local.update_path: padded`) gives every sample a row as wide as the longest one in
its micro-batch. Here the micro-batch is one row of its samples side by side, with position ids that
restart at 0 for each sample, so attention never crosses a sample boundary:

- flash-attention (CUDA) reads the restarts as variable-length sequences (no mask at all);
- sdpa and eager (CPU, or CUDA without flash-attention) get a block-diagonal causal mask that
  transformers derives from the same position ids (`masking_utils.find_packed_sequence_indices`).

Only the positions whose next token is trained are scored (`Packing.scored`): the loss, the KL
penalty, the entropy and every metric read per-token values through the loss mask, so the
others would be computed and thrown away. The per-token results are scattered back into the
[samples, T-1] layout of `Batch`, so the loss code does not know which path produced them.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch

from agenttune.backbones.local.batching import TrainItem
from agenttune.backbones.local.logprobs import Batch, collate


@dataclass
class Packing:
    """One packed micro-batch on the device, and where its scores go in the [samples, T-1] layout."""

    input_ids: torch.Tensor  # [1, N]: the samples end to end
    position_ids: torch.Tensor  # [1, N]: 0..len-1 per sample
    scored: torch.Tensor  # [M]: positions in the row whose *next* token is trained
    targets: torch.Tensor  # [M]: that next token
    rows: torch.Tensor  # [M]: the sample of each scored position
    columns: torch.Tensor  # [M]: its column in the shifted per-token layout
    chunk_tokens: int = 1024  # scored positions per chunk of logits (`local.logits_chunk_tokens`)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def unpack(self, values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """[M] scores -> [samples, T-1], 0 where nothing is trained (differentiable)."""
        out = values.new_zeros(shape)
        return out.index_put((self.rows, self.columns), values)


def balanced_micro_batches(items: list[TrainItem], token_budget: int) -> list[list[TrainItem]]:
    """Split the items into as few micro-batches of at most `token_budget` tokens as the greedy finds,
    with token counts as even as possible.

    Longest first onto the least-loaded micro-batch (LPT); when a micro-batch would overflow, one more
    is opened and the greedy starts over. An item longer than the budget gets a micro-batch of its own.
    Even token counts keep the per-micro-batch memory and time flat across a step.
    """
    oversized = [[item] for item in items if len(item) > token_budget]
    rest = sorted((item for item in items if len(item) <= token_budget), key=len, reverse=True)
    if not rest:
        return oversized
    count = math.ceil(sum(len(item) for item in rest) / token_budget)
    while True:
        bins = _longest_first(rest, count)
        if all(sum(len(item) for item in group) <= token_budget for group in bins):
            return oversized + bins
        count += 1


def _longest_first(items: list[TrainItem], count: int) -> list[list[TrainItem]]:
    """Each item (longest first) onto the micro-batch with the fewest tokens so far."""
    groups: list[list[TrainItem]] = [[] for _ in range(count)]
    loads = [(0, index) for index in range(count)]
    for item in items:
        load, index = heapq.heappop(loads)
        groups[index].append(item)
        heapq.heappush(loads, (load + len(item), index))
    return [group for group in groups if group]


def collate_packed(items: list[TrainItem], pad_token_id: int, device: torch.device | str, *,
                   chunk_tokens: int = 1024) -> Batch:
    """The padded `Batch` of these items (its per-token tensors are small) plus the packed row that the
    model actually runs on."""
    batch = collate(items, pad_token_id, device)
    batch.packing = pack(items, device, chunk_tokens=chunk_tokens)
    return batch


def pack(items: list[TrainItem], device: torch.device | str, *, chunk_tokens: int = 1024) -> Packing:
    input_ids: list[int] = []
    position_ids: list[int] = []
    scored: list[int] = []
    targets: list[int] = []
    rows: list[int] = []
    columns: list[int] = []
    for row, item in enumerate(items):
        offset = len(input_ids)
        input_ids += item.input_ids
        position_ids += range(len(item))
        for column in range(len(item) - 1):  # position `column` scores token `column + 1`
            if item.loss_mask[column + 1]:
                scored.append(offset + column)
                targets.append(item.input_ids[column + 1])
                rows.append(row)
                columns.append(column)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return Packing(
        input_ids=tensor(input_ids)[None], position_ids=tensor(position_ids)[None],
        scored=tensor(scored), targets=tensor(targets), rows=tensor(rows), columns=tensor(columns),
        chunk_tokens=chunk_tokens,
    )
