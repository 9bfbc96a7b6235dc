"""Per-token log-probabilities of a micro-batch under a causal language model.

Two paths give the same tensors: the padded one (`local.update_path: padded`) runs the whole model on
right-padded rows and takes its full logits; the packed one (the default) runs packed rows and scores
the trained tokens from the hidden states in chunks (packing.py, chunked_logprobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agenttune.backbones.local.batching import TrainItem
from agenttune.backbones.local.chunked_logprobs import packed_token_logprobs
from agenttune.backbones.local.packing import Packing, pack
from agenttune.backbones.local.prompt_sharing import Unit


@dataclass
class Batch:
    """A micro-batch on the device. Per-token tensors are shifted: column t scores input token t+1."""

    input_ids: torch.Tensor  # [rows, T]
    attention_mask: torch.Tensor  # [rows, T]
    targets: torch.Tensor  # [rows, T-1]
    mask: torch.Tensor  # [rows, T-1], float 0/1: the tokens that are trained on
    sample_logprobs: torch.Tensor  # [rows, T-1]: the engine's logprobs of the targets
    advantages: torch.Tensor  # [rows]
    engine_logprobs: torch.Tensor | None = None  # [rows] bool; None: every row has the engine's logprobs
    packing: Packing | None = None  # set: the model runs on this packed row instead (packing.py)

    def fill_missing_logprobs(self, logprobs: torch.Tensor) -> None:
        """Rows whose engine reported no logprobs take the trainer's own (before any update): no
        mismatch is invented for them, and a rollout correction sees a ratio of 1."""
        if self.engine_logprobs is not None:
            self.sample_logprobs = torch.where(self.engine_logprobs[:, None], self.sample_logprobs,
                                               logprobs.detach())
            self.engine_logprobs = None

    @property
    def num_trained_tokens(self) -> int:
        return int(self.mask.sum().item())

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    @property
    def num_model_tokens(self) -> int:
        """The tokens the model runs on: a shared prompt counts once (prompt_sharing.py)."""
        return self.packing.tokens if self.packing is not None else self.num_tokens


def pad_token_id(tokenizer: Any) -> int:
    """The id `collate` pads rows with: the tokenizer's pad token, else its end of sequence, else 0."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad) if pad is not None else 0


def collate(items: list[TrainItem], pad_token_id: int, device: torch.device | str) -> Batch:
    """Right-pad the items into one batch (padding is masked out of attention and loss)."""
    width = max(len(item) for item in items)

    def padded(values: list, fill) -> list:
        return values + [fill] * (width - len(values))

    input_ids = torch.tensor([padded(item.input_ids, pad_token_id) for item in items], dtype=torch.long)
    attention = torch.tensor([padded([1] * len(item), 0) for item in items], dtype=torch.long)
    mask = torch.tensor([padded(item.loss_mask, 0) for item in items], dtype=torch.float32)
    sampled = torch.tensor([padded(item.sample_logprobs, 0.0) for item in items], dtype=torch.float32)
    advantages = torch.tensor([item.advantage for item in items], dtype=torch.float32)
    reported = [item.engine_logprobs for item in items]
    return Batch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        targets=input_ids[:, 1:].to(device),
        mask=mask[:, 1:].to(device),
        sample_logprobs=sampled[:, 1:].to(device),
        advantages=advantages.to(device),
        engine_logprobs=None if all(reported) else torch.tensor(reported, device=device),
    )


def collate_packed(units: list[Unit], pad_token_id: int, device: torch.device | str, *,
                   chunk_tokens: int = 1024) -> Batch:
    """The padded `Batch` of these units' samples (its per-token tensors are small) plus the packed rows
    that the model actually runs on (packing.py)."""
    batch = collate([item for unit in units for item in unit.items], pad_token_id, device)
    batch.packing = pack(units, device, pad_token_id=pad_token_id, chunk_tokens=chunk_tokens)
    return batch


def token_logprobs(
    model: torch.nn.Module, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of every target token, and optionally the entropy of each next-token distribution.

    Logits are divided by the sampling `temperature` (when positive) so that the probabilities match
    the distribution the rollouts were sampled from. The entropy is computed without gradient.
    A packed batch is scored on its trained tokens only (0 elsewhere), without full logits.
    """
    if batch.packing is not None:
        logprobs, entropy = packed_token_logprobs(model, batch.packing, temperature=temperature,
                                                  with_entropy=with_entropy)
        shape = batch.targets.shape  # back into the padded layout: the loss code sees the same tensors
        return batch.packing.unpack(logprobs, shape), None if entropy is None else batch.packing.unpack(entropy, shape)
    output = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = output.logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    picked = torch.gather(logits, -1, batch.targets.unsqueeze(-1)).squeeze(-1)
    logprobs = picked - normaliser
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probabilities = torch.softmax(logits, dim=-1)
            entropy = normaliser - (probabilities * logits).sum(-1)
    return logprobs, entropy
