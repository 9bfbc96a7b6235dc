"""AdamW with its states in CPU memory (`local.optimizer_offload`), for weights that live on the GPU.

AdamW keeps two float32 moments per trained weight: for a full fine-tune of a bf16 model that is 4x
the weights themselves, often more than the activations. Here the optimizer steps float32 CPU copies
of the weights: gradients go to the CPU, the step runs there, the new weights come back. The copies
are refreshed from the device before every step, so anything else that writes the weights (a
checkpoint load, the warm-up) is never undone. The price is two transfers of the weights per step.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class CPUOffloadAdamW(torch.optim.AdamW):
    """torch's AdamW on CPU float32 copies of `params`; `step` moves gradients in and weights back."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **options) -> None:
        self.device_params = list(params)
        pin = any(p.device.type == "cuda" for p in self.device_params) and torch.cuda.is_available()
        copies = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin) for p in self.device_params]
        for copy, param in zip(copies, self.device_params, strict=True):
            copy.copy_(param.detach())
        options.update(foreach=False, fused=False)
        super().__init__([torch.nn.Parameter(copy) for copy in copies], **options)

    @property
    def host_params(self) -> list[torch.nn.Parameter]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        for host, device in zip(self.host_params, self.device_params, strict=True):
            host.copy_(device)
            host.grad = None if device.grad is None else device.grad.to("cpu", torch.float32)
        loss = super().step(closure)
        for host, device in zip(self.host_params, self.device_params, strict=True):
            device.copy_(host, non_blocking=True)
            host.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param in self.device_params:
            param.grad = None
