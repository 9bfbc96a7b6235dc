"""Rows of one batch sampled by different LoRA adapters (several policies in one run).

Every LoRA layer of the model gets, once, a forward of its own beside peft's: while a forward pass
runs inside `rows_with_adapters`, the layer computes its base output once and adds each row's
adapter's update (rows named "__base__" get none): in a batch mixing adapters, with two products over
the layer's adapters concatenated along the rank (every row through all of them, each row's own part kept
by a mask); outside, peft's forward runs as before (training, a batch that names no adapter). The rows of
each adapter are found once per forward pass, not once per layer. The sum is peft's own (base + B(A(x)) x scaling, per row); peft's per-row
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
        self.order = served  # the adapters' order in each layer's concatenated weights
        self.served = frozenset(served) | {BASE_ADAPTER}
        self.groups: list[tuple[str, Any]] | None = None  # inside rows_with_adapters: (adapter, rows)
        self.names: list[str] | None = None  # a batch mixing adapters: each row's adapter
        self.masks: dict[tuple[tuple[str, int], ...], Any] = {}  # rank layout -> [rows, 1, rank] row masks
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
    state.names = names if len(set(names)) > 1 else None
    try:
        yield
    finally:
        state.groups = state.names = None
        state.masks = {}


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
    if state.names is not None and x.dim() == 3 and not layer.training:
        return result + _concatenated_update(state, layer, x).to(result.dtype)
    for name, rows in state.groups:
        if name not in layer.lora_A:
            continue
        weight = layer.lora_A[name].weight
        part = (x if rows is None else x[rows]).to(weight.dtype)
        update = layer.lora_B[name](layer.lora_A[name](layer.lora_dropout[name](part))) * layer.scaling[name]
        update = update.to(result.dtype)
        result = result + update if rows is None else result.index_add(0, rows, update)
    return result


def _concatenated_update(state: _RowAdapters, layer: Any, x: Any) -> Any:
    """Every row's LoRA update in two products: x through the layer's adapters' A matrices concatenated
    ([rows, seq, r1 + r2 + ...]), a mask keeping each row's own adapter's part (zeros for the base model's
    rows), then the B matrices concatenated (scaling folded in). The rank is small, so running every row
    through every adapter costs little arithmetic; the alternatives cost more on small models, where
    dispatch outweighs arithmetic: per-adapter products cost a gather, two products and an index-add per
    adapter and layer, and gathering each row's own A and B copies them once per row (bench/multi_policy.py).
    Dropout is left out: it is the identity in eval mode, and the engine runs the model in eval mode."""
    a, b, layout = _concatenated_weights(state, layer)
    mask = state.masks.get(layout)
    if mask is None:
        mask = state.masks[layout] = _row_mask(state.names or [], layout, a.dtype, a.device)
    return ((x.to(a.dtype) @ a.T) * mask) @ b.T


def _row_mask(names: list[str], layout: tuple[tuple[str, int], ...], dtype: Any, device: Any) -> Any:
    """[rows, 1, total rank]: ones over each row's own adapter's ranks, zeros elsewhere."""
    import torch

    mask = torch.zeros(len(names), 1, sum(rank for _, rank in layout), dtype=dtype)
    starts, at = {}, 0
    for name, rank in layout:
        starts[name] = (at, at + rank)
        at += rank
    for row, name in enumerate(names):
        if name in starts:
            mask[row, 0, slice(*starts[name])] = 1
    return mask.to(device)


def _concatenated_weights(state: _RowAdapters, layer: Any) -> tuple[Any, Any, tuple[tuple[str, int], ...]]:
    """The layer's adapters' A matrices concatenated ([r1 + r2 + ..., in]) and B matrices ([out, r1 + r2 +
    ...], scaling folded in), with their layout ((adapter, rank), ...); rebuilt when a weight changed:
    training updates the adapters in place between forward passes, which moves each tensor's version counter."""
    import torch

    present = [name for name in state.order if name in layer.lora_A]
    key = tuple((name, id(layer.lora_A[name].weight), layer.lora_A[name].weight._version,
                 id(layer.lora_B[name].weight), layer.lora_B[name].weight._version, layer.scaling[name])
                for name in present)
    cached = getattr(layer, "_agenttune_concatenated", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    with torch.no_grad():
        a = torch.cat([layer.lora_A[name].weight for name in present]).contiguous()
        b = torch.cat([layer.lora_B[name].weight.to(a.dtype) * layer.scaling[name] for name in present],
                      dim=1).contiguous()
    weights = (a, b, tuple((name, layer.lora_A[name].weight.shape[0]) for name in present))
    layer._agenttune_concatenated = (key, weights)
    return weights
