"""Padding-free micro-batches: samples packed end to end into rows, balanced by token count.

The padded path (`local.update_path: padded`) gives every sample a row as wide as the longest one in
its micro-batch. Here samples sit side by side in rows of that width, with position ids that
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


@dataclass
class Packing:
    """One packed micro-batch on the device, and where its scores go in the [samples, T-1] layout."""

    input_ids: torch.Tensor  # [rows, width]: samples end to end, a row as wide as the longest sample
    position_ids: torch.Tensor  # [rows, width]: 0..len-1 per sample
    scored: torch.Tensor  # [M]: positions (flat, row-major) whose *next* token is trained
    targets: torch.Tensor  # [M]: that next token
    rows: torch.Tensor  # [M]: the sample of each scored position
    columns: torch.Tensor  # [M]: its column in the shifted per-token layout
    chunk_tokens: int = 1024  # scored positions per chunk of logits (`local.logits_chunk_tokens`)
    shared_rows: bool = False  # some row holds several samples: attention must keep them apart

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


def pack(items: list[TrainItem], device: torch.device | str, *, pad_token_id: int = 0,
         chunk_tokens: int = 1024) -> Packing:
    """Rows as wide as the longest item, filled first-fit longest first.

    One row per micro-batch would be ideal for variable-length (flash) attention, but sdpa and eager
    attend over the whole row under a block-diagonal mask: rows of 1M tokens would cost 1M^2. Rows as
    wide as the longest sample cost no more attention than the padded path and leave little padding.
    The padding at a row's end gets its own position ids (a sample of its own) and is never scored.
    """
    width = max(len(item) for item in items)
    rows: list[list[int]] = []  # item indices per row
    free: list[int] = []
    for index in sorted(range(len(items)), key=lambda i: len(items[i]), reverse=True):
        row = next((r for r, room in enumerate(free) if room >= len(items[index])), None)
        if row is None:
            rows.append([])
            free.append(width)
            row = len(rows) - 1
        rows[row].append(index)
        free[row] -= len(items[index])
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    position_ids = torch.empty((len(rows), width), dtype=torch.long)
    scored: list[int] = []
    targets: list[int] = []
    samples: list[int] = []
    columns: list[int] = []
    for row, members in enumerate(rows):
        offset = 0
        for index in members:
            item = items[index]
            input_ids[row, offset:offset + len(item)] = torch.tensor(item.input_ids)
            position_ids[row, offset:offset + len(item)] = torch.arange(len(item))
            for column in range(len(item) - 1):  # position `column` scores token `column + 1`
                if item.loss_mask[column + 1]:
                    scored.append(row * width + offset + column)
                    targets.append(item.input_ids[column + 1])
                    samples.append(index)
                    columns.append(column)
            offset += len(item)
        position_ids[row, offset:] = torch.arange(width - offset)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return Packing(
        input_ids=input_ids.to(device), position_ids=position_ids.to(device),
        scored=tensor(scored), targets=tensor(targets), rows=tensor(samples), columns=tensor(columns),
        chunk_tokens=chunk_tokens, shared_rows=any(len(members) > 1 for members in rows),
    )
