"""A group's samples hold their common prompt once: the update runs it once instead of once per sample.

The samples of a GRPO group start with the same prompt (the task, its system prompt and tools): in the
quickstart ~310 of a sample's ~350 tokens. Untrained, the prompt still runs forward and backward in every
sample, so an update of 8-sample groups spent ~85 % of its compute on copies. Here the samples whose
untrained beginnings are equal become one `Unit`: the common tokens once, then each sample's remaining
tokens, side by side in one packed row. A custom attention mask makes it a prefix tree: each sample's
tokens see the common tokens and their own earlier tokens, never a sibling's; their position ids continue
from the common tokens'. Every trained token then sees exactly the context it had alone, so log-probs and
gradients are the unshared ones (up to float summation order); the common tokens' hidden states receive
the sum of their samples' gradients, as they did copied.

The mask is a dense [rows, 1, width, width] tensor, which sdpa and eager attention take as-is
(transformers' masking_utils returns a 4D mask unchanged). flash-attention and flex attention take no
such mask, and a custom mask would switch off a model's sliding windows: there, and with
`local.share_prompts: false`, every sample runs whole (`supports_prompt_sharing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from agenttune.backbones.local.batching import TrainItem

# A unit of several samples (common + every sample's rest) stays under this: its mask costs width^2 per
# row and its attention width x hidden per token, so rows never get wider than the longest sample or this.
UNIT_TOKENS = 2048


@dataclass
class Unit:
    """Samples whose first `shared` tokens are equal and score no trained token: held once, then each
    sample's tokens from `shared` on. `shared` is 0 for a sample on its own."""

    items: list[TrainItem]
    shared: int = 0
    _length: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._length = self.shared + sum(len(item) - self.shared for item in self.items)

    def __len__(self) -> int:
        return self._length


def alone(items: list[TrainItem]) -> list[Unit]:
    """Every sample whole (no sharing)."""
    return [Unit([item]) for item in items]


def share_prompts(items: list[TrainItem], token_budget: int) -> list[Unit]:
    """The samples grouped by their untrained beginning, each group in as few units as fit `UNIT_TOKENS`
    (or `token_budget` when smaller: a unit must fit a micro-batch); a sample that fits with no other
    stays whole."""
    limit = min(UNIT_TOKENS, token_budget)
    groups: dict[tuple[int, ...], list[TrainItem]] = {}
    for item in items:
        groups.setdefault(tuple(item.input_ids[:_untrained_beginning(item)]), []).append(item)
    units: list[Unit] = []
    for beginning, members in groups.items():
        shared = len(beginning)
        if len(members) < 2 or shared == 0:
            units.extend(alone(members))
            continue
        current: list[TrainItem] = []
        for item in sorted(members, key=len, reverse=True):
            if current and len(Unit([*current, item], shared)) > limit:
                units.append(_unit(current, shared))
                current = []
            current.append(item)
        units.append(_unit(current, shared))
    return units


def _unit(items: list[TrainItem], shared: int) -> Unit:
    return Unit(items, shared) if len(items) > 1 else Unit(items)


def _untrained_beginning(item: TrainItem) -> int:
    """How many leading tokens score no trained token: position t scores token t+1, so the last one
    before the first trained token belongs to the sample itself."""
    first_trained = next((index for index, trained in enumerate(item.loss_mask) if trained), len(item))
    return max(first_trained - 1, 0)


def tree_mask(units: torch.Tensor, branches: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[rows, 1, W, W] bool, True where a query (dim 2) may attend to a key (dim 3): same unit, not later,
    and the key is common (branch -1) or on the query's own branch."""
    same_unit = units[:, :, None] == units[:, None, :]
    not_later = positions[:, None, :] <= positions[:, :, None]
    key_branch = branches[:, None, :]
    visible = (key_branch == -1) | (key_branch == branches[:, :, None])
    return (same_unit & not_later & visible)[:, None]


def supports_prompt_sharing(model: Any) -> bool:
    """Whether this transformers model takes a custom 4D mask as it is, with nothing lost (see above)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(config, "sliding_window", None) is None or getattr(config, "use_sliding_window", True) is False


def model_mask(mask: torch.Tensor, model: Any, dtype: torch.dtype) -> torch.Tensor:
    """The boolean tree mask in the form the model's attention adds or reads: sdpa reads booleans, eager
    adds 0 where allowed and the dtype's minimum elsewhere."""
    if model.config._attn_implementation == "sdpa":
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
