"""One GRPO training step on a batch of judged episodes.

The trainer owns the optimizer and the schedule; the model object is shared with the inference
engine, so the next rollouts see the updated weights without a copy.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from agenttune.backbones.local.advantages import per_row, step_advantages
from agenttune.backbones.local.batching import ItemStats, TrainItem, build_items, micro_batches
from agenttune.backbones.local.chunked_logprobs import causal_lm
from agenttune.backbones.local.logprobs import Batch, collate, collate_packed, token_logprobs
from agenttune.backbones.local.loss import aggregate, kl_penalty
from agenttune.backbones.local.offload import CPUOffloadAdamW
from agenttune.backbones.local.options import local_options
from agenttune.backbones.local.packing import balanced_micro_batches
from agenttune.backbones.local.prompt_sharing import alone, share_prompts, supports_prompt_sharing
from agenttune.backbones.local.rollout_correction import Correction, correct, normalize
from agenttune.backbones.local.rollout_correction import metrics as correction_metrics
from agenttune.backbones.local.schedule import lr_factor
from agenttune.backbones.local.teacher import load_teacher
from agenttune.backbones.local.update_threads import (
    MICRO_BATCHES_PER_THREAD,
    UpdateThreads,
    accumulate,
    update_threads,
)
from agenttune.components.estimators.base import AdvantageEstimator
from agenttune.components.losses.base import LossInput, PolicyLoss
from agenttune.config.models import AgentTuneConfig
from agenttune.config.run import get_logger
from agenttune.workflow.episode import Episode

log = get_logger("local")

# Reference log-probs come from a frozen model, or from the policy with its LoRA adapter switched off.
ReferenceScope = Callable[[], AbstractContextManager[torch.nn.Module]]


class GRPOTrainer:
    def __init__(
        self,
        model: torch.nn.Module,
        config: AgentTuneConfig,
        *,
        pad_token_id: int,
        total_steps: int,
        reference: ReferenceScope | None = None,
        estimator: AdvantageEstimator | None = None,
        policy_loss: PolicyLoss | None = None,
    ):
        self.model = model
        self.config = config
        if estimator is None or policy_loss is None:
            from agenttune.registry.resolution import resolve_objective

            estimator, policy_loss = resolve_objective(config)
        self.estimator, self.policy_loss = estimator, policy_loss
        self.teacher = load_teacher(policy_loss.options, config, model) if policy_loss.needs_teacher else None
        self.pad_token_id = pad_token_id
        self.device = next(model.parameters()).device
        self.reference = reference
        if config.algorithm.kl_coef > 0 and reference is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        trainer = config.trainer
        self.trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
        threads = update_threads(config, self.device)
        self.threads = UpdateThreads(threads) if threads > 1 else None  # CPU: micro-batches side by side
        self._width = self.threads  # this step's (`step(threads=...)`)
        if local_options(config).optimizer_offload:
            self.optimizer: torch.optim.Optimizer = CPUOffloadAdamW(
                self.trainable, lr=trainer.learning_rate, weight_decay=trainer.weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(
                self.trainable, lr=trainer.learning_rate, weight_decay=trainer.weight_decay,
                # CUDA: one fused kernel for the whole update (transformers' Trainer default there, and
                # what TRL runs in bench/local_vs_trl.py), where the per-tensor loop launches ~10 kernels
                # per parameter tensor. CPU: the per-tensor loop gives bit-identical results after a reload.
                foreach=False, fused=self.device.type == "cuda",
            )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_factor(trainer.lr_schedule, warmup_steps=trainer.warmup_steps, total_steps=total_steps),
        )

    # -- the step ----------------------------------------------------------------------------------
    def step(self, episodes: list[Episode], *, threads: int | None = None) -> dict[str, float]:
        """Update the policy on these episodes; return the step's training metrics (`train/...`).

        `threads=1`: this step's micro-batches one after the other on the calling thread (the asynchronous
        loop leaves the other cores to the rollout); otherwise on all of the update's threads, if it has any."""
        started, retries = time.perf_counter(), _allocation_retries(self.device)
        self._width = self.threads if threads is None or threads > 1 else None
        algorithm = self.config.algorithm
        max_prompt_length, max_response_length = self.config.data.length_limits()
        advantages = step_advantages(episodes, self.estimator, zero_variance=algorithm.zero_variance_groups,
                                     overlong=algorithm.overlong_shaping)
        rows, by_row = per_row(episodes, advantages)
        items, item_stats = build_items(
            rows, by_row, max_prompt_length=max_prompt_length, max_response_length=max_response_length,
        )
        metrics = {
            "train/groups": float(advantages.num_groups),
            "train/zero_variance_groups": float(advantages.zero_variance_groups),
            "train/zero_variance_fraction": advantages.zero_variance_fraction,
            "train/failed_episodes_skipped": float(advantages.failed_episodes),
            "train/overlong_penalty": advantages.overlong_penalty,
            "train/lr": self.optimizer.param_groups[0]["lr"],
            **_item_metrics(item_stats, len(items)),
        }
        if items:
            was_training = self.model.training
            self.model.train()
            try:
                metrics.update(self._update(self._micro_batches(items)))
            finally:
                self.model.train(was_training)
        with warnings.catch_warnings():  # a step without an update still advances the schedule
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        _warn_about_lengths(item_stats, max_prompt_length, max_response_length)
        elapsed = time.perf_counter() - started
        metrics["perf/train_time_s"] = elapsed
        metrics["perf/update_threads"] = float(self._width.size if self._width is not None else 1)
        metrics["perf/train_tokens_per_s"] = metrics.get("train/tokens", 0.0) / elapsed if elapsed else 0.0
        if self.device.type == "cuda":
            metrics["perf/cuda_alloc_retries"] = float(_allocation_retries(self.device) - retries)
        return metrics

    def _micro_batches(self, items: list[TrainItem]) -> list[Batch]:
        """Packed and balanced by token count (the default), or right-padded (`local.update_path: padded`)."""
        local = local_options(self.config)
        if local.update_path == "padded":
            return [collate(group, self.pad_token_id, self.device)
                    for group in micro_batches(items, local.micro_batch_tokens)]
        units = share_prompts(items, local.micro_batch_tokens) if self._shares_prompts else alone(items)
        at_least = MICRO_BATCHES_PER_THREAD * self.threads.size if self.threads is not None else 1
        return [collate_packed(group, self.pad_token_id, self.device, chunk_tokens=local.logits_chunk_tokens)
                for group in balanced_micro_batches(units, local.micro_batch_tokens, at_least=at_least)]

    @property
    def _shares_prompts(self) -> bool:
        """Every model that scores the packed rows takes the tree mask (the reference is the policy's copy
        or the policy itself; a served teacher reads the padded rows)."""
        teacher = getattr(self.teacher, "model", None)
        return local_options(self.config).share_prompts and all(
            supports_prompt_sharing(causal_lm(model)) for model in (self.model, teacher) if model is not None)

    def _update(self, batches: list[Batch]) -> dict[str, float]:
        local, algorithm = local_options(self.config), self.config.algorithm
        correction = algorithm.rollout_correction
        on_policy = local.ppo_epochs * local.mini_batches == 1
        # With a single update the weights cannot move before the loss is taken, so the "old"
        # log-probs are the current ones (detached): the ratio is exactly 1 and no extra pass is needed.
        # Decoupled rollout correction compares the engine with π_old before any update. Its
        # importance weights are then per micro-batch and taken in the update's own pass (the
        # default of asynchronous modes: a whole forward pass less); rejection masks and batch
        # normalisation must be known up front (they set the loss's denominators): a scoring pass.
        scoring_pass = not on_policy or (correction.enabled and not correction.bypass_mode
                                         and not self._corrects_in_the_update_pass(on_policy))
        totals: dict[str, float] = {}
        old = None
        if scoring_pass:
            old = []
            for batch, (logprobs, entropy) in zip(batches, self._map(self._logprobs_without_grad, batches),
                                                   strict=True):
                batch.fill_missing_logprobs(logprobs)
                _record_first_pass(totals, batch, logprobs, entropy)
                old.append(logprobs)
        corrections = None
        if old is not None and correction.enabled and not correction.bypass_mode:
            corrections = [correct(o - batch.sample_logprobs, batch.mask, correction) for o, batch in zip(
                old, batches, strict=True)]
            if correction.rollout_is_batch_normalize:
                totals["is_batch_norm_factor"] = normalize(corrections, correction.rollout_is)
        reference = [self._reference_logprobs(batch) for batch in batches] if algorithm.kl_coef > 0 else None
        teacher = self.teacher.score(batches) if self.teacher is not None else None
        for _ in range(local.ppo_epochs):
            for indices in _split(len(batches), local.mini_batches):
                stats = self._optimizer_update(
                    [batches[i] for i in indices],
                    [old[i] for i in indices] if old else None,
                    [reference[i] for i in indices] if reference else None,
                    [corrections[i] for i in indices] if corrections else None,
                    record_first_pass=not scoring_pass,
                    teacher=[teacher[i] for i in indices] if teacher else None,
                )
                _add_stats(totals, stats)
        if corrections is not None:  # counted once, not once per update
            for item in corrections:
                _add_stats(totals, {f"rc_{key}": value for key, value in item.stats.items()})
        return _finish_metrics(totals, batches)

    def _optimizer_update(
        self,
        batches: list[Batch],
        old: list[torch.Tensor] | None,
        reference: list[torch.Tensor] | None,
        corrections: list[Correction] | None,
        *,
        record_first_pass: bool,
        teacher: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        algorithm = self.config.algorithm
        masks = [c.mask for c in corrections] if corrections else [batch.mask for batch in batches]
        total_tokens = sum(int(mask.sum()) for mask in masks)
        total_rows = sum(batch.input_ids.shape[0] for batch in batches)

        def micro_batch(index: int) -> tuple[torch.Tensor, dict[str, float]]:
            """The micro-batch's loss (its share of the update's) and its statistics."""
            batch = batches[index]
            stats: dict[str, float] = {}
            logprobs, entropy = token_logprobs(
                self.model, batch, temperature=self._temperature, with_entropy=record_first_pass
            )
            batch.fill_missing_logprobs(logprobs)  # (the first update: the policy is still pi_old)
            applied = corrections[index] if corrections else self._correction_in_pass(batch, logprobs, stats)
            mask = applied.mask if applied is not None else batch.mask
            policy_loss, clipped = self._policy_loss(batch, logprobs, old[index] if old is not None else None,
                                                     applied, teacher[index] if teacher is not None else None)
            if teacher is not None:  # the sampled reverse KL to the teacher, before this update
                gap = (logprobs.detach() - teacher[index]) * mask
                stats["teacher_kl_sum"] = float(gap.sum())
            per_token = policy_loss

            def share(values: torch.Tensor) -> torch.Tensor:
                return aggregate(values, mask, self.policy_loss.loss_agg_mode or algorithm.loss_agg_mode,
                                 total_tokens=total_tokens, total_sequences=total_rows)

            if reference is not None:
                kl = kl_penalty(logprobs, reference[index], algorithm.kl_estimator)
                per_token = per_token + algorithm.kl_coef * kl
                stats["kl_sum"] = float((kl.detach() * mask).sum())
            loss = share(per_token)
            stats["loss"] = float(loss.detach())
            stats["pg_loss"] = float(share(policy_loss.detach()))
            stats["clipped_tokens"] = float((clipped * mask).sum())
            stats["trained_tokens"] = float(mask.sum())
            if record_first_pass:
                _record_first_pass(stats, batch, logprobs.detach(), entropy)
            return loss, stats

        def with_gradients(index: int) -> tuple[tuple[torch.Tensor | None, ...], dict[str, float]]:
            loss, stats = micro_batch(index)
            return torch.autograd.grad(loss, self.trainable, allow_unused=True), stats

        stats = {"updates": 1.0}
        self.optimizer.zero_grad(set_to_none=True)
        if self._width is None:
            for index in range(len(batches)):
                loss, micro_stats = micro_batch(index)
                loss.backward()
                _add_stats(stats, micro_stats)
        else:  # each micro-batch's gradients are added in micro-batch order (update_threads.py)
            for gradients, micro_stats in self._width.map(with_gradients, range(len(batches))):
                accumulate(self.trainable, gradients)
                _add_stats(stats, micro_stats)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.config.trainer.grad_clip)
        if math.isfinite(float(grad_norm)):
            self.optimizer.step()
        else:  # a NaN/inf gradient would poison the weights and the optimizer moments for good
            stats["skipped_updates"] = 1.0
        self.optimizer.zero_grad(set_to_none=True)
        stats["grad_norm"] = float(grad_norm)
        return stats

    def _corrects_in_the_update_pass(self, on_policy: bool) -> bool:
        """Decoupled correction whose weights the update's own pass can take: π_old is the current
        policy (one update a step) and nothing needs the whole step's weights or masks first."""
        options = self.config.algorithm.rollout_correction
        return (on_policy and options.rollout_is is not None and options.rollout_rs is None
                and not options.rollout_is_batch_normalize)

    def _correction_in_pass(self, batch: Batch, logprobs: torch.Tensor, stats: dict[str, float]) -> Correction | None:
        """The correction measured against the current policy, in the update's pass: in bypass mode
        (π_old is the engine), or decoupled when π_old is the current policy (one update a step)."""
        options = self.config.algorithm.rollout_correction
        if options.bypass_mode:
            with_weights = options.loss_type == "reinforce"
        elif options.enabled:  # _update left out the scoring pass: see _corrects_in_the_update_pass
            with_weights = True
        else:
            return None
        applied = correct(logprobs.detach() - batch.sample_logprobs, batch.mask, options, with_weights=with_weights)
        _add_stats(stats, {f"rc_{key}": value for key, value in applied.stats.items()})
        return applied

    def _policy_loss(self, batch: Batch, logprobs: torch.Tensor, old: torch.Tensor | None,
                     applied: Correction | None,
                     teacher: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token policy loss and where clipping won, with the rollout correction applied."""
        algorithm = self.config.algorithm
        options = algorithm.rollout_correction
        if options.bypass_mode and options.loss_type == "reinforce":
            assert applied is not None and applied.weights is not None
            loss = -applied.weights * batch.advantages.unsqueeze(-1) * logprobs
            return loss, torch.zeros_like(loss)
        if options.bypass_mode:
            old = batch.sample_logprobs  # the engine's logprobs are π_old: the ratio is the correction
        output = self.policy_loss(LossInput(
            logprobs, old if old is not None else logprobs.detach(), batch.advantages, batch.mask,
            clip_low=algorithm.clip_ratio_low, clip_high=algorithm.clip_ratio_high, teacher_logprobs=teacher,
        ))
        loss, clipped = output.per_token, output.clipped
        if applied is not None and applied.weights is not None:
            loss = loss * applied.weights
        return loss, clipped

    @property
    def _temperature(self) -> float:
        return self.config.rollout.temperature

    def _map(self, function: Callable[[Batch], Any], batches: list[Batch]) -> Iterator[Any]:
        """`function` of each micro-batch, in order: side by side on the update's threads when it has them."""
        return self._width.map(function, batches) if self._width is not None else map(function, batches)

    @torch.no_grad()
    def _logprobs_without_grad(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        return token_logprobs(self.model, batch, temperature=self._temperature, with_entropy=True)

    @torch.no_grad()
    def _reference_logprobs(self, batch: Batch) -> torch.Tensor:
        assert self.reference is not None
        with self.reference() as reference_model:
            return token_logprobs(reference_model, batch, temperature=self._temperature)[0]

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def close(self) -> None:
        """The end of the run: a distillation teacher's engine (a vLLM engine, a server's client) goes."""
        if self.teacher is not None:
            self.teacher.close()
        if self.threads is not None:
            self.threads.close()


def _split(count: int, parts: int) -> Iterator[list[int]]:
    """Indices 0..count-1 in `parts` contiguous chunks (fewer when there are fewer items)."""
    parts = max(1, min(parts, count))
    size, extra = divmod(count, parts)
    start = 0
    for part in range(parts):
        end = start + size + (1 if part < extra else 0)
        yield list(range(start, end))
        start = end


def _record_first_pass(stats: dict[str, float], batch: Batch, logprobs: torch.Tensor, entropy) -> None:
    """Before any update this step: how far the policy is from what the engine sampled, and its entropy."""
    mask = batch.mask
    difference = (logprobs - batch.sample_logprobs).abs() * mask
    stats["mismatch_sum"] = stats.get("mismatch_sum", 0.0) + float(difference.sum())
    stats["mismatch_max"] = max(stats.get("mismatch_max", 0.0), float(difference.max()))
    prob_difference = (logprobs.exp() - batch.sample_logprobs.exp()).abs() * mask
    stats["prob_mismatch_sum"] = stats.get("prob_mismatch_sum", 0.0) + float(prob_difference.sum())
    stats["first_pass_tokens"] = stats.get("first_pass_tokens", 0.0) + float(mask.sum())
    if entropy is not None:
        stats["entropy_sum"] = stats.get("entropy_sum", 0.0) + float((entropy * mask).sum())


def _finish_metrics(totals: dict[str, float], batches: list[Batch]) -> dict[str, float]:
    updates = totals.get("updates", 1.0)
    trained = max(totals.get("trained_tokens", 0.0), 1.0)
    first = max(totals.get("first_pass_tokens", 0.0), 1.0)
    metrics = {
        "train/loss": totals.get("loss", 0.0) / updates,
        "train/pg_loss": totals.get("pg_loss", 0.0) / updates,
        "train/clip_fraction": totals.get("clipped_tokens", 0.0) / trained,
        "train/grad_norm": totals.get("grad_norm", 0.0) / updates,
        "train/updates": updates,
        "train/skipped_updates": totals.get("skipped_updates", 0.0),
        "train/micro_batches": float(len(batches)),
        "train/tokens": float(sum(batch.num_tokens for batch in batches)),
        "train/model_tokens": float(sum(batch.num_model_tokens for batch in batches)),
        "train/trained_tokens": float(sum(batch.num_trained_tokens for batch in batches)),
        "train/entropy": totals.get("entropy_sum", 0.0) / first,
        "train/logprob_mismatch": totals.get("mismatch_sum", 0.0) / first,
        "train/logprob_mismatch_max": totals.get("mismatch_max", 0.0),
        "train/prob_mismatch": totals.get("prob_mismatch_sum", 0.0) / first,
    }
    if "kl_sum" in totals:
        metrics["train/kl"] = totals["kl_sum"] / trained
    if "teacher_kl_sum" in totals:
        metrics["train/teacher_reverse_kl"] = totals["teacher_kl_sum"] / trained
    corrections = {key[3:]: value for key, value in totals.items() if key.startswith("rc_")}
    if corrections:
        metrics.update(correction_metrics(corrections))
    if "is_batch_norm_factor" in totals:
        metrics["train/rollout_is_batch_norm_factor"] = totals["is_batch_norm_factor"]
    return metrics


def _warn_about_lengths(stats: ItemStats, max_prompt: int, max_response: int) -> None:
    """Said once per step, so that a limit that costs training data is never silent."""
    if not (stats.split or stats.dropped_calls):
        return
    dropped = ", ".join(f"{count} ({reason})" for reason, count in stats.dropped_calls.items()) or "none"
    log.warning(f"{stats.split} samples were longer than data.max_prompt_length={max_prompt} / "
                f"data.max_response_length={max_response} and were split at call boundaries; calls that fit in "
                f"no part were dropped: {dropped}. Raise the limits (they default to model.max_model_len) to "
                "train on everything.")


def _add_stats(totals: dict[str, float], stats: dict[str, float]) -> None:
    """Sums, except maxima (keys ending in `_max`), which stay maxima."""
    for key, value in stats.items():
        totals[key] = max(totals.get(key, value), value) if key.endswith("_max") else totals.get(key, 0.0) + value


def _item_metrics(stats: ItemStats, num_items: int) -> dict[str, float]:
    lengths = stats.response_lengths
    metrics = {
        "train/samples": float(num_items),
        "train/samples_not_trainable": float(stats.not_trainable),
        "train/samples_prompt_too_long": float(stats.too_long_prompt),
        "train/samples_split": float(stats.split),
        "train/samples_logprobs_recomputed": float(stats.logprobs_recomputed),
        **{f"train/calls_dropped/{reason}": float(count) for reason, count in stats.dropped_calls.items()},
    }
    if lengths:  # absent, not 0, on steps without trained samples: curves skip them
        metrics["train/response_length_mean"] = sum(lengths) / len(lengths)
    return metrics


def _allocation_retries(device: torch.device) -> int:
    """How often torch's CUDA allocator found no free block, released its whole cache and asked the
    driver again: each costs a device synchronisation and fresh allocations. Logged to tell whether
    an update near the GPU's memory limit paid for that (docs/performance.md: the H100 bench's
    updates of 0.5 to 3.2 s, cause not yet established)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
