"""Tinker's built-in losses, computed by agenttune's policy losses where they are the same objective.

Tinker gives every token its own advantage and sums the per-token losses; agenttune's losses take
one advantage per row and leave the averaging to the trainer. So each token is passed as a row of
one token, and the per-token losses come back unaveraged:

    cross_entropy        -w log p                           components/losses/supervised.py's cross_entropy
    importance_sampling  -A p/q                             ppo_clip with an infinite clip range
    ppo                  -min(A r, A clip(r, low, high))    ppo_clip, clip_ratio_low = 1 - low, high = high - 1
    cispo                -sg(clip(r, low, high)) A log p    cispo, the same clip range
    gspo                 -min(A s_t, A clip(s_t, low, high)) gspo, the same clip range (below)
    dro                  -(A log p - beta/2 (log p - log q)^2)  written out here: agenttune has no such loss

(p: the policy's probability of the target token, q: the sampler's, r = p/q; `low` and `high` are
`loss_fn_config`'s clip_low_threshold and clip_high_threshold, 0.8 and 1.2 by default.)

gspo (Tinker's GSPO-token): s = exp(mean of log r over the tokens `sequence_ratio_mask` marks), and every
token's ratio s_t has s's value and the gradient of its own log p. agenttune's gspo loss computes the
same per row, with one advantage per row: the datum is passed as one row per distinct advantage value
(the mask as the row's mask), and each token takes its loss from the row of its own advantage. The
one difference: agenttune caps the sequence log-ratio at 10 (a ratio of e^10), Tinker does not.
dro needs `loss_fn_config["beta"]`. `stable_reinforce` is not served: its objective uses per-sequence
information the hosted sampler records (`record_stability_info`) and is not published. Server-side
`custom` losses are not served either.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from agenttune.entrypoints.tinker.futures import TinkerError

if TYPE_CHECKING:
    import torch

SERVED = ("cross_entropy", "importance_sampling", "ppo", "cispo", "gspo", "dro")
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
        why = (" (its objective is not published: it trains on per-sequence information the hosted sampler "
               "records)" if loss_fn == "stable_reinforce" else "")
        raise TinkerError(f"The loss {loss_fn!r} is not served yet{why}; this server computes "
                          f"{', '.join(SERVED)} (and forward_backward_custom on the client).")
    rows = logprobs.unsqueeze(-1)  # [T, 1]: each token a row of its own
    ones = torch.ones_like(rows)
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        weights = torch.ones_like(logprobs) if weights is None else weights
        batch = LossInput(rows, rows.detach(), weights, ones, 0.0, 0.0)
        return CrossEntropyLoss()(batch).per_token.squeeze(-1)
    old = _required(inputs, "logprobs", loss_fn)
    advantages = _required(inputs, "advantages", loss_fn)
    if loss_fn == "dro":
        return _dro(logprobs, old, advantages, config)
    if loss_fn == "importance_sampling":
        batch = LossInput(rows, old.unsqueeze(-1), advantages, ones, math.inf, math.inf)
        return PPOClipLoss()(batch).per_token.squeeze(-1)
    low = float(config.get("clip_low_threshold", DEFAULT_CLIP_LOW))
    high = float(config.get("clip_high_threshold", DEFAULT_CLIP_HIGH))
    if loss_fn == "gspo":
        return _gspo(logprobs, old, advantages, _required(inputs, "sequence_ratio_mask", loss_fn), low, high)
    batch = LossInput(rows, old.unsqueeze(-1), advantages, ones, 1.0 - low, high - 1.0)
    loss = PPOClipLoss() if loss_fn == "ppo" else CISPOLoss()
    return loss(batch).per_token.squeeze(-1)


def _gspo(logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, ratio_mask: torch.Tensor,
          low: float, high: float) -> torch.Tensor:
    """Tinker's gspo through agenttune's: one row per distinct advantage, each token's loss from its row."""
    import torch

    from agenttune.components.losses.base import LossInput
    from agenttune.components.losses.policy_gradient import GSPOLoss

    mask = (ratio_mask != 0).to(logprobs.dtype)
    if not bool(mask.any()):
        raise TinkerError("The gspo loss needs at least one token marked in loss_fn_inputs['sequence_ratio_mask'].")
    values, row_of_token = torch.unique(advantages, return_inverse=True)
    count = values.shape[0]
    batch = LossInput(logprobs.unsqueeze(0).expand(count, -1), old.unsqueeze(0).expand(count, -1), values,
                      mask.unsqueeze(0).expand(count, -1), 1.0 - low, high - 1.0)
    per_token = GSPOLoss()(batch).per_token  # [distinct advantages, T]
    return per_token.gather(0, row_of_token.unsqueeze(0)).squeeze(0)


def _dro(logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor,
         config: dict[str, Any]) -> torch.Tensor:
    if "beta" not in config:
        raise TinkerError("The dro loss needs loss_fn_config['beta'] (the weight of its quadratic penalty).")
    beta = float(config["beta"])
    return -(logprobs * advantages - 0.5 * beta * (logprobs - old) ** 2)


def _required(inputs: dict[str, torch.Tensor], key: str, loss_fn: str) -> torch.Tensor:
    if key not in inputs:
        raise TinkerError(f"The {loss_fn} loss needs loss_fn_inputs[{key!r}] in every datum.")
    return inputs[key]
