"""Padding-free micro-batches: samples packed end to end into rows, balanced by token count.

The padded path (`local.update_path: padded`) gives every sample a row as wide as the longest one in
its micro-batch. Here samples sit side by side in rows of that width, with position ids that
restart at 0 for each sample, so attention never crosses a sample boundary:

- flash-attention (CUDA) reads the restarts as variable-length sequences (no mask at all);
- sdpa and eager (CPU, or CUDA without flash-attention) get a block-diagonal causal mask that
  transformers derives from the same position ids (`masking_utils.find_packed_sequence_indices`).

Under sdpa and eager, a group's samples that start with the same prompt hold it once (prompt_sharing.py):
they are packed as one unit under a tree mask of the packing's own.

Only the positions whose next token is trained are scored (`Packing.scored`): the loss, the KL
penalty, the entropy and every metric read per-token values through the loss mask, so the
others would be computed and thrown away. The per-token results are scattered back into the
[samples, T-1] layout of `Batch`, so the loss code does not know which path produced them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import torch

from agenttune.backbones.local.batching import TrainItem
from agenttune.backbones.local.prompt_sharing import Unit, tree_mask


@dataclass
class Packing:
    """One packed micro-batch on the device, and where its scores go in the [samples, T-1] layout."""

    input_ids: torch.Tensor  # [rows, width]: units end to end, a row as wide as the longest unit
    position_ids: torch.Tensor  # [rows, width]: 0..len-1 per sample (a shared prompt's tokens once)
    scored: torch.Tensor  # [M]: positions (flat, row-major) whose *next* token is trained
    targets: torch.Tensor  # [M]: that next token
    rows: torch.Tensor  # [M]: the sample of each scored position
    columns: torch.Tensor  # [M]: its column in the shifted per-token layout
    chunk_tokens: int = 1024  # scored positions per chunk of logits (`local.logits_chunk_tokens`)
    shared_rows: bool = False  # some row holds several samples: attention must keep them apart
    attention_mask: torch.Tensor | None = None  # [rows, 1, width, width] bool: units share prompts
    tokens: int = 0  # the units' tokens (row padding aside): fewer than the samples' when prompts are shared

    def unpack(self, values: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """[M] scores -> [samples, T-1], 0 where nothing is trained (differentiable)."""
        out = values.new_zeros(shape)
        return out.index_put((self.rows, self.columns), values)


def balanced_micro_batches(units: list[Unit], token_budget: int, *, at_least: int = 1) -> list[list[Unit]]:
    """Split the units (a sample, or samples sharing their prompt) into as few micro-batches of at most
    `token_budget` tokens as the greedy finds (but `at_least` of them, units permitting: the update's
    threads take several each, update_threads.py), with token counts as even as possible.

    Longest first onto the least-loaded micro-batch (LPT); when a micro-batch would overflow, one more
    is opened and the greedy starts over. A unit longer than the budget gets a micro-batch of its own.
    Even token counts keep the per-micro-batch memory and time flat across a step.
    """
    oversized = [[unit] for unit in units if len(unit) > token_budget]
    rest = sorted((unit for unit in units if len(unit) <= token_budget), key=len, reverse=True)
    if not rest:
        return oversized
    count = max(math.ceil(sum(len(unit) for unit in rest) / token_budget), at_least - len(oversized))
    while True:
        bins = _longest_first(rest, count)
        if all(sum(len(unit) for unit in group) <= token_budget for group in bins):
            return oversized + bins
        count += 1


def _longest_first(units: list[Unit], count: int) -> list[list[Unit]]:
    """Each unit (longest first) onto the micro-batch with the fewest tokens so far."""
    groups: list[list[Unit]] = [[] for _ in range(count)]
    loads = [(0, index) for index in range(count)]
    for unit in units:
        load, index = heapq.heappop(loads)
        groups[index].append(unit)
        heapq.heappush(loads, (load + len(unit), index))
    return [group for group in groups if group]


def pack(units: list[Unit], device: torch.device | str, *, pad_token_id: int = 0,
         chunk_tokens: int = 1024) -> Packing:
    """Rows as wide as the longest unit, filled first-fit longest first; the samples keep their order in
    `flatten(units)` (the `Batch` rows).

    One row per micro-batch would be ideal for variable-length (flash) attention, but sdpa and eager
    attend over the whole row under a block-diagonal mask: rows of 1M tokens would cost 1M^2. Rows as
    wide as the longest unit cost no more attention than the padded path and leave little padding.
    The padding at a row's end gets its own position ids (a sample of its own) and is never scored.
    Units that share a prompt (prompt_sharing.py) get a tree mask; without them, position ids say it all.
    """
    width = max(len(unit) for unit in units)
    first_sample = [0, *itertools.accumulate(len(unit.items) for unit in units)]
    rows: list[list[int]] = []  # unit indices per row
    free: list[int] = []
    for index in sorted(range(len(units)), key=lambda i: len(units[i]), reverse=True):
        row = next((r for r, room in enumerate(free) if room >= len(units[index])), None)
        if row is None:
            rows.append([])
            free.append(width)
            row = len(rows) - 1
        rows[row].append(index)
        free[row] -= len(units[index])
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    position_ids = torch.empty((len(rows), width), dtype=torch.long)
    unit_ids = torch.full((len(rows), width), -1, dtype=torch.long)  # the row's padding: a unit of its own
    branches = torch.zeros((len(rows), width), dtype=torch.long)
    scored = _Scored()

    def write(row: int, offset: int, ids: list[int], first_position: int, branch: int) -> int:
        """`ids` at `offset` of `row`, positions from `first_position`; the offset after them."""
        end = offset + len(ids)
        input_ids[row, offset:end] = torch.tensor(ids)
        position_ids[row, offset:end] = torch.arange(first_position, first_position + len(ids))
        branches[row, offset:end] = branch
        return end

    for row, members in enumerate(rows):
        offset = 0
        for index in members:
            unit = units[index]
            unit_ids[row, offset:offset + len(unit)] = index
            if unit.shared:  # the common tokens once, on the branch every sample sees
                offset = write(row, offset, unit.items[0].input_ids[:unit.shared], 0, -1)
            for branch, item in enumerate(unit.items):
                scored.add(item, first_sample[index] + branch, start=row * width + offset - unit.shared,
                           first_column=unit.shared)
                offset = write(row, offset, item.input_ids[unit.shared:], unit.shared, branch)
        position_ids[row, offset:] = torch.arange(width - offset)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    sharing = any(unit.shared for unit in units)
    return Packing(
        input_ids=input_ids.to(device), position_ids=position_ids.to(device),
        scored=tensor(scored.positions), targets=tensor(scored.targets), rows=tensor(scored.samples),
        columns=tensor(scored.columns), chunk_tokens=chunk_tokens,
        shared_rows=any(len(members) > 1 for members in rows),
        attention_mask=tree_mask(unit_ids, branches, position_ids).to(device) if sharing else None,
        tokens=sum(len(unit) for unit in units),
    )


@dataclass
class _Scored:
    """The positions whose next token is trained, gathered sample by sample."""

    positions: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    columns: list[int] = field(default_factory=list)

    def add(self, item: TrainItem, sample: int, *, start: int, first_column: int) -> None:
        """`item`'s columns from `first_column` on, column c found at flat position `start + c`."""
        for column in range(first_column, len(item) - 1):  # position `column` scores token `column + 1`
            if item.loss_mask[column + 1]:
                self.positions.append(start + column)
                self.targets.append(item.input_ids[column + 1])
                self.samples.append(sample)
                self.columns.append(column)
