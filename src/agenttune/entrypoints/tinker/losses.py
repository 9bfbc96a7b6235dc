"""Tinker's built-in losses, computed by agenttune's policy losses where they are the same objective.

Tinker gives every token its own advantage and sums the per-token losses; agenttune's losses take
one advantage per row and leave the averaging to the trainer. So each token is passed as a row of
one token, and the per-token losses come back unaveraged:

    cross_entropy        -w log p                           components/losses/supervised.py's cross_entropy
    importance_sampling  -A p/q                             ppo_clip with an infinite clip range
    ppo                  -min(A r, A clip(r, low, high))    ppo_clip, clip_ratio_low = 1 - low, high = high - 1
    cispo                -sg(clip(r, low, high)) A log p    cispo, the same clip range

(p: the policy's probability of the target token, q: the sampler's, r = p/q; `low` and `high` are
`loss_fn_config`'s clip_low_threshold and clip_high_threshold, 0.8 and 1.2 by default.)
`dro`, `gspo`, `stable_reinforce` and server-side `custom` losses are not served yet.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from agenttune.entrypoints.tinker.futures import TinkerError

if TYPE_CHECKING:
    import torch

SERVED = ("cross_entropy", "importance_sampling", "ppo", "cispo")
DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2


def elementwise_loss(loss_fn: str, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor],
                     config: dict[str, Any]) -> torch.Tensor:
    """The per-token loss [T] of one datum, from its target tokens' log-probs [T] under the policy."""
    import torch

    from agenttune.components.losses.base import LossInput
    from agenttune.components.losses.policy_gradient import CISPOLoss, PPOClipLoss
    from agenttune.components.losses.supervised import CrossEntropyLoss

    if loss_fn not in SERVED:
        raise TinkerError(f"The loss {loss_fn!r} is not served yet; this server computes "
                          f"{', '.join(SERVED)} (and forward_backward_custom on the client).")
    rows = logprobs.unsqueeze(-1)  # [T, 1]: each token a row of its own
    ones = torch.ones_like(rows)
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        weights = torch.ones_like(logprobs) if weights is None else weights
        batch = LossInput(rows, rows.detach(), weights, ones, 0.0, 0.0)
        return CrossEntropyLoss()(batch).per_token.squeeze(-1)
    old = _required(inputs, "logprobs", loss_fn).unsqueeze(-1)
    advantages = _required(inputs, "advantages", loss_fn)
    if loss_fn == "importance_sampling":
        batch = LossInput(rows, old, advantages, ones, math.inf, math.inf)
        return PPOClipLoss()(batch).per_token.squeeze(-1)
    low = float(config.get("clip_low_threshold", DEFAULT_CLIP_LOW))
    high = float(config.get("clip_high_threshold", DEFAULT_CLIP_HIGH))
    batch = LossInput(rows, old, advantages, ones, 1.0 - low, high - 1.0)
    loss = PPOClipLoss() if loss_fn == "ppo" else CISPOLoss()
    return loss(batch).per_token.squeeze(-1)


def _required(inputs: dict[str, torch.Tensor], key: str, loss_fn: str) -> torch.Tensor:
    if key not in inputs:
        raise TinkerError(f"The {loss_fn} loss needs loss_fn_inputs[{key!r}] in every datum.")
    return inputs[key]
