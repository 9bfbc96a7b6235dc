"""Supervised warm-up: a few passes of next-token training on demonstration conversations.

A tiny or untuned model may never produce the tool-call format on its own, and RL cannot reinforce
what is never sampled. A short warm-up on demonstrations (OpenAI-format conversations, JSON lines of
`{"messages": [...], "tools": [...]}`) teaches the format; RL then improves the behaviour.

Only the assistant turns are trained, up to and including the end-of-turn token: exactly the tokens
the model generates at rollout time, rendered with the same chat template the gateway uses.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agenttune.backbones.local.batching import TrainItem, micro_batches
from agenttune.backbones.local.logprobs import collate, pad_token_id, token_logprobs
from agenttune.errors import UserError


def read_conversations(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"local.warmup.data: {str(path)!r} does not exist.",
                        hint="Point it at a JSONL file of {\"messages\": [...], \"tools\": [...]} demonstrations.")
    conversations = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"local.warmup.data: line {number} of {str(path)!r} is not JSON: {error}.") from error
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise UserError(f"local.warmup.data: line {number} of {str(path)!r} has no \"messages\" list.",
                            hint="Each line must be {\"messages\": [...], \"tools\": [...]} (tools optional).")
        conversations.append(row)
    if not conversations:
        raise UserError(f"local.warmup.data: {str(path)!r} holds no conversations.")
    return conversations


def demonstration_item(tokenizer: Any, messages: list[dict[str, Any]], tools: list | None = None) -> TrainItem:
    """Token ids of a whole conversation, with mask 1 on each assistant turn up to its end-of-turn token."""
    def render(upto: int, prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tools=tools or None, tokenize=False,
                                             add_generation_prompt=prompt)

    text = render(len(messages), False)
    eos = tokenizer.eos_token or ""
    spans = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start, turn = len(render(index, True)), render(index + 1, False)
        end = turn.find(eos, start) + len(eos) if eos and turn.find(eos, start) >= 0 else len(turn)
        if not text.startswith(turn[:end]):
            raise UserError("The chat template renders a conversation differently from its own prefixes, "
                            "so assistant turns cannot be located for the warm-up.",
                            hint="Use demonstrations without history rewriting (e.g. no dropped reasoning).")
        spans.append((start, end))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(start <= first and last <= end for start, end in spans) and last > first)
            for first, last in encoded["offset_mapping"]]
    return TrainItem(list(encoded["input_ids"]), mask, [0.0] * len(mask), advantage=0.0)


def _constant_then_decay(steps: int, decay_fraction: float = 0.2):
    """Full learning rate, then a linear decay to 0 over the last `decay_fraction` of the steps.

    Small models learn some skills (copying a number from the context) abruptly after a plateau;
    a rate that starts decaying early can stall them just before that happens.
    """
    decay_start = int(steps * (1 - decay_fraction))

    def factor(step: int) -> float:
        if step < decay_start:
            return 1.0
        return max(0.0, 1.0 - (step - decay_start) / max(steps - decay_start, 1))

    return factor


def warm_up_on_file(
    model: torch.nn.Module,
    tokenizer: Any,
    path: str | Path,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    micro_batch_tokens: int,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """`local.warmup` on the demonstrations in `path`: only as many conversations as the warm-up will see
    are rendered (drawn with `seed`), then `supervised_warmup`. Returns its last metrics."""
    conversations = read_conversations(path)
    needed = steps * batch_size
    if needed < len(conversations):
        conversations = random.Random(seed).sample(conversations, needed)
    items = [demonstration_item(tokenizer, row["messages"], row.get("tools")) for row in conversations]
    return supervised_warmup(model, items, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                             micro_batch_tokens=micro_batch_tokens, pad_token_id=pad_token_id(tokenizer), seed=seed,
                             on_step=on_step)


def supervised_warmup(
    model: torch.nn.Module,
    items: list[TrainItem],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    micro_batch_tokens: int,
    pad_token_id: int,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """`steps` AdamW updates of token-mean cross-entropy on the masked tokens; returns the last metrics."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate,
                                  weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _constant_then_decay(steps))
    rng = random.Random(seed)
    order: list[int] = []
    metrics: dict[str, float] = {}
    model.train()
    for step in range(1, steps + 1):
        started = time.perf_counter()
        batch: list[TrainItem] = []
        while len(batch) < batch_size:
            if not order:
                order = list(range(len(items)))
                rng.shuffle(order)
            batch.append(items[order.pop()])
        total = sum(item.num_trained_tokens for item in batch)
        loss_sum, tokens = 0.0, 0
        optimizer.zero_grad(set_to_none=True)
        for group in micro_batches(batch, micro_batch_tokens):
            tensors = collate(group, pad_token_id, device)
            logprobs, _ = token_logprobs(model, tensors)
            loss = -(logprobs * tensors.mask).sum() / max(total, 1)
            loss.backward()
            loss_sum += float(loss.detach())
            tokens += tensors.num_tokens
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        elapsed = time.perf_counter() - started
        metrics = {"warmup/loss": loss_sum, "warmup/tokens_per_s": tokens / elapsed if elapsed else 0.0}
        if on_step is not None:
            on_step(step, metrics)
    optimizer.zero_grad(set_to_none=True)
    return metrics
