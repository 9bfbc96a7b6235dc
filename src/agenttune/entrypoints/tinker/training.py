"""Training clients: a LoRA adapter and its Adam optimizer each, on the one base model.

`forward_backward` accumulates gradients in the adapter's tensors until `optim_step` applies them
(torch's AdamW with the step's Adam parameters, as Tinker documents its optimizer), so several
forward_backward calls before a step add up, as in Tinker. Saving writes the adapter and the
optimizer's state under the checkpoint store; loading restores them, also after a restart.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agenttune.entrypoints.tinker.checkpoints import Checkpoint, CheckpointStore
from agenttune.entrypoints.tinker.futures import TinkerError
from agenttune.entrypoints.tinker.losses import elementwise_loss
from agenttune.entrypoints.tinker.models import LoraSettings, ModelHost
from agenttune.entrypoints.tinker.protobuf import Datum

OPTIMIZER_FILE = "optimizer.pt"


@dataclass
class TrainingRun:
    model_id: str
    adapter: str
    lora: LoraSettings
    optimizer: Any
    steps: int = 0
    last_request: float = field(default_factory=time.time)  # what `get_training_run` answers


class Trainer:
    def __init__(self, host: ModelHost, store: CheckpointStore, *, batch_record: Path | None = None):
        self.host, self.store = host, store
        self.runs: dict[str, TrainingRun] = {}
        # `--record-batches`: every datum a client trains on, one JSON line per forward_backward, so a
        # client's loop can be checked against what it sampled (the trinity backbone's CPU path keeps one)
        self.batch_record = batch_record

    def create(self, model_id: str, lora: LoraSettings) -> TrainingRun:
        if model_id in self.runs:
            raise TinkerError(f"The model {model_id} exists already.", 409)
        if lora.rank < 1:
            raise TinkerError("lora_config.rank must be at least 1.")
        try:
            adapter = self.host.add_adapter(lora)
        except ValueError as error:
            raise TinkerError(f"Cannot create this LoRA adapter: {error}.") from None
        run = TrainingRun(model_id, adapter, lora, self._optimizer(adapter))
        self.runs[model_id] = run
        return run

    def run(self, model_id: str) -> TrainingRun:
        run = self.runs.get(model_id)
        if run is None:
            raise TinkerError(f"No training client has the model id {model_id!r} on this server (training "
                              "clients end with the server; their saved checkpoints remain).", 404)
        run.last_request = time.time()
        return run

    def unload(self, model_id: str) -> None:
        run = self.runs.pop(model_id, None)
        if run is not None:
            self.host.remove_adapter(run.adapter)

    # -- forward / backward / step ---------------------------------------------------------------------

    def forward_backward(self, model_id: str, data: list[Datum], loss_fn: str, config: dict[str, Any],
                         *, forward_only: bool) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum its target tokens' log-probs and per-token loss; metrics with `loss:sum`."""
        import torch

        run = self.run(model_id)
        if not data:
            raise TinkerError("forward_backward needs at least one datum.")
        with self.host.using(run.adapter) as model, torch.set_grad_enabled(not forward_only):
            logprobs = self._target_logprobs(model, data)
            losses = [elementwise_loss(loss_fn, row, self._inputs(datum, row), config)
                      for row, datum in zip(logprobs, data, strict=True)]
            total = torch.stack([loss.sum() for loss in losses]).sum()
            if not forward_only:
                total.backward()
        if not forward_only and self.batch_record is not None:
            self._record(model_id, loss_fn, data)
        outputs = [{"logprobs": row.detach().float().cpu().numpy(),
                    "elementwise_loss": loss.detach().float().cpu().numpy()}
                   for row, loss in zip(logprobs, losses, strict=True)]
        return outputs, {"loss:sum": float(total.detach())}

    def _record(self, model_id: str, loss_fn: str, data: list[Datum]) -> None:
        assert self.batch_record is not None
        line = {"model_id": model_id, "loss_fn": loss_fn, "time": time.time(),
                "datums": [{"tokens": list(datum.tokens),
                            **{name: value.reshape(-1).tolist() for name, value in datum.inputs.items()}}
                           for datum in data]}
        with self.batch_record.open("a", encoding="utf-8") as record:
            record.write(json.dumps(line) + "\n")

    def optim_step(self, model_id: str, params: dict[str, Any]) -> dict[str, float]:
        import torch

        run = self.run(model_id)
        parameters = self.host.parameters(run.adapter)
        clip = float(params.get("grad_clip_norm", 0.0))
        norm = torch.nn.utils.clip_grad_norm_(parameters, clip if clip > 0 else float("inf"))
        for group in run.optimizer.param_groups:
            group.update(lr=float(params.get("learning_rate", 1e-4)), eps=float(params.get("eps", 1e-12)),
                         betas=(float(params.get("beta1", 0.9)), float(params.get("beta2", 0.95))),
                         weight_decay=float(params.get("weight_decay", 0.0)))
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.steps += 1
        return {"grad_norm": float(norm), "step": float(run.steps)}

    # -- checkpoints -------------------------------------------------------------------------------------

    def save(self, model_id: str, kind: str, name: str, *, overwrite: bool = True) -> Checkpoint:
        import torch

        run = self.run(model_id)
        checkpoint = self.store.new(model_id, kind, name, overwrite=overwrite)  # type: ignore[arg-type]
        self.host.save_adapter(run.adapter, checkpoint.directory)
        if kind == "weights":
            torch.save(run.optimizer.state_dict(), checkpoint.directory / OPTIMIZER_FILE)
        self.store.write_metadata(checkpoint, {"base_model": self.host.name, "model_id": model_id, "kind": kind,
                                               "lora": run.lora.as_dict(), "steps": run.steps,
                                               "saved_at": time.time()})
        return checkpoint

    def create_from(self, model_id: str, path: str, *, optimizer: bool) -> TrainingRun:
        """A new training client with the weights (and optimizer state) of the checkpoint at `path`."""
        checkpoint = self._checkpoint_for(path)
        run = self.create(model_id, LoraSettings(**checkpoint.metadata()["lora"]))
        self.load(model_id, path, optimizer=optimizer)
        return run

    def load(self, model_id: str, path: str, *, optimizer: bool) -> None:
        """The checkpoint's weights into the client's adapter; its optimizer state too, or a fresh one."""
        import torch
        from safetensors.torch import load_file

        from agenttune.entrypoints.tinker.models import WEIGHTS_FILE

        run = self.run(model_id)
        checkpoint = self._checkpoint_for(path)
        if LoraSettings(**checkpoint.metadata()["lora"]) != run.lora:
            raise TinkerError(f"{path} was saved with other LoRA settings than this training client's.")
        state = load_file(str(checkpoint.directory / WEIGHTS_FILE), device=str(self.host.device))
        try:
            self.host.set_weights(run.adapter, state)
        except ValueError as error:
            raise TinkerError(f"Cannot load {path}: {error}.") from None
        run.optimizer = self._optimizer(run.adapter)
        if optimizer:
            saved = checkpoint.directory / OPTIMIZER_FILE
            if not saved.is_file():
                raise TinkerError(f"{path} holds no optimizer state (sampler weights have none).")
            run.optimizer.load_state_dict(torch.load(saved, map_location=self.host.device, weights_only=True))

    def _checkpoint_for(self, path: str) -> Checkpoint:
        checkpoint = self.store.find(path)
        if checkpoint.metadata().get("base_model") != self.host.name:
            raise TinkerError(f"{path} was trained on {checkpoint.metadata().get('base_model')!r}; this server "
                              f"serves {self.host.name!r}.")
        return checkpoint

    # -- helpers -----------------------------------------------------------------------------------------

    def _optimizer(self, adapter: str) -> Any:
        import torch

        return torch.optim.AdamW(self.host.parameters(adapter), lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                 weight_decay=0.0)

    def _target_logprobs(self, model: Any, data: list[Datum]) -> list[Any]:
        """log p(target_tokens[t] | tokens[:t+1]) for each datum, from one padded batch."""
        import torch

        _check_data(data, model.config.vocab_size)
        lengths = [len(datum.tokens) for datum in data]
        device = self.host.device
        ids = torch.zeros((len(data), max(lengths)), dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        targets = torch.zeros_like(ids)
        for row, datum in enumerate(data):
            ids[row, :lengths[row]] = torch.tensor(datum.tokens, device=device)
            mask[row, :lengths[row]] = 1
            targets[row, :lengths[row]] = torch.as_tensor(datum.inputs["target_tokens"].reshape(-1), device=device)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return [logprobs[row, :lengths[row]] for row in range(len(data))]

    def _inputs(self, datum: Datum, logprobs: Any) -> dict[str, Any]:
        import torch

        return {name: torch.as_tensor(value.reshape(-1), dtype=torch.float32, device=logprobs.device)
                for name, value in datum.inputs.items() if name != "target_tokens"}


def _check_data(data: list[Datum], vocab: int) -> None:
    """Every datum: a model input, target tokens and other inputs one per input token, ids in the vocabulary."""
    for datum in data:
        if not datum.tokens:
            raise TinkerError("A datum has an empty model_input.")
        if "target_tokens" not in datum.inputs:
            raise TinkerError("Every datum needs loss_fn_inputs['target_tokens'].")
        for name, value in datum.inputs.items():
            if value.size != len(datum.tokens):
                raise TinkerError(f"loss_fn_inputs[{name!r}] has {value.size} values for {len(datum.tokens)} "
                                  "input tokens; give one per token.")
        targets = datum.inputs["target_tokens"]
        if max(datum.tokens) >= vocab or min(datum.tokens) < 0 or targets.max() >= vocab or targets.min() < 0:
            raise TinkerError(f"A token id is outside this model's vocabulary (0..{vocab - 1}).")
