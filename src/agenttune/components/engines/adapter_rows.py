"""Rows of one batch sampled by different LoRA adapters (several policies in one run).

Every LoRA layer of the model gets, once, a forward of its own beside peft's: while a forward pass
runs inside `rows_with_adapters`, the layer computes its base output once and adds each adapter's
update to that adapter's rows only (rows named "__base__" get none); outside, peft's forward runs as
before (training, a batch that names no adapter). The rows of each adapter are found once per forward
pass, not once per layer. The sum is peft's own (base + B(A(x)) x scaling, per row); peft's per-row
`adapter_names` does the same, but sorts the rows out again in every layer, in Python, which on
tiny://default cost 30-40 % of the decode speed of a batch naming a single adapter (bench/multi_policy.py).
The layers' own attributes are read (`base_layer`, `lora_A`, `lora_B`, `scaling`, `lora_dropout`):
peft is pinned in pyproject.toml's `local` extra for that reason.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any

from agenttune.config.policies import BASE_ADAPTER

_STATE = "_agenttune_row_adapters"  # the model attribute holding the installed hooks' state


class _RowAdapters:
    """What the hooks hand to every LoRA layer: the running forward pass's names, or None."""

    def __init__(self, served: tuple[str, ...]):
        self.served = frozenset(served) | {BASE_ADAPTER}
        self.groups: list[tuple[str, Any]] | None = None  # inside rows_with_adapters: (adapter, rows)
        self.device: Any = None


def adapter_names(model: Any) -> tuple[str, ...]:
    """The LoRA adapters a peft model holds, in the order they were added; () for a plain model."""
    config = getattr(model, "peft_config", None)
    return tuple(config) if isinstance(config, dict) else ()


def rows_with_adapters(model: Any, adapters: list[str | None]) -> AbstractContextManager[Any]:
    """Within it, a forward pass runs row i with `adapters[i]` (None: the base model). A batch that
    names no adapter runs as before: with the model's active adapter, if any."""
    if not any(adapters):
        return nullcontext()
    return _named_rows(_hooks(model), [name or BASE_ADAPTER for name in adapters])


@contextmanager
def _named_rows(state: _RowAdapters, names: list[str]):
    unknown = set(names) - state.served
    if unknown:  # such rows would silently run on the base model
        raise ValueError(f"no LoRA adapter named {sorted(unknown)} in the model (it has {sorted(state.served)})")
    state.groups = _groups(names, state.device)
    try:
        yield
    finally:
        state.groups = None


def _groups(names: list[str], device: Any) -> list[tuple[str, Any]]:
    """(adapter, its rows as an index tensor; None: every row) for the adapters the rows name."""
    import torch

    if len(set(names)) == 1:
        return [] if names[0] == BASE_ADAPTER else [(names[0], None)]
    rows: dict[str, list[int]] = {}
    for row, name in enumerate(names):
        rows.setdefault(name, []).append(row)
    return [(name, torch.tensor(indices, device=device)) for name, indices in rows.items() if name != BASE_ADAPTER]


def _hooks(model: Any) -> _RowAdapters:
    state = getattr(model, _STATE, None)
    served = adapter_names(model)
    if state is None or state.served != frozenset(served) | {BASE_ADAPTER}:
        from peft.tuners.lora import Linear

        state = _RowAdapters(served)
        state.device = next(model.parameters()).device
        for module in model.modules():
            if isinstance(module, Linear):  # an instance attribute: nn.Module.__call__ finds it first
                module.forward = partial(  # type: ignore[method-assign]
                    _forward, state, module, type(module).forward.__get__(module))
        setattr(model, _STATE, state)
    return state


def _forward(state: _RowAdapters, layer: Any, peft_forward: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    if state.groups is None or kwargs.get("adapter_names") is not None:
        return peft_forward(x, *args, **kwargs)
    result = layer.base_layer(x, *args, **kwargs)
    for name, rows in state.groups:
        if name not in layer.lora_A:
            continue
        weight = layer.lora_A[name].weight
        part = (x if rows is None else x[rows]).to(weight.dtype)
        update = layer.lora_B[name](layer.lora_A[name](layer.lora_dropout[name](part))) * layer.scaling[name]
        update = update.to(result.dtype)
        result = result + update if rows is None else result.index_add(0, rows, update)
    return result
