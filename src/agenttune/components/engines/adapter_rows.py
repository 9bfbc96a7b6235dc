"""Rows of one batch sampled by different LoRA adapters (several policies in one run).

Every LoRA layer of the model gets, once, a forward of its own beside peft's: while a forward pass
runs inside `rows_with_adapters`, the layer computes its base output once and adds each row's
adapter's update (rows named "__base__" get none): in a batch mixing adapters, with two batched products
over the layer's adapters stacked once (each row gathers its own A and B); outside, peft's forward runs as
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
        self.order = served  # each adapter's slot in the layers' stacked weights; the base model's is last
        self.served = frozenset(served) | {BASE_ADAPTER}
        self.groups: list[tuple[str, Any]] | None = None  # inside rows_with_adapters: (adapter, rows)
        self.slots: Any = None  # a batch mixing adapters: each row's slot (a tensor), for the stacked product
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
    if len(set(names)) > 1:
        import torch

        slot = {name: index for index, name in enumerate(state.order)} | {BASE_ADAPTER: len(state.order)}
        state.slots = torch.tensor([slot[name] for name in names], device=state.device)
    try:
        yield
    finally:
        state.groups = state.slots = None


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
    if state.slots is not None and x.dim() == 3 and not layer.training:
        return result + _stacked_update(state, layer, x).to(result.dtype)
    for name, rows in state.groups:
        if name not in layer.lora_A:
            continue
        weight = layer.lora_A[name].weight
        part = (x if rows is None else x[rows]).to(weight.dtype)
        update = layer.lora_B[name](layer.lora_A[name](layer.lora_dropout[name](part))) * layer.scaling[name]
        update = update.to(result.dtype)
        result = result + update if rows is None else result.index_add(0, rows, update)
    return result


def _stacked_update(state: _RowAdapters, layer: Any, x: Any) -> Any:
    """Every row's LoRA update in two batched products: each row gathers its adapter's A and B (scaling
    folded into B; the base model's slot is zeros) from the layer's stacked weights. Per-adapter products
    on each adapter's rows cost a gather, two products and an index-add per adapter and layer, which on
    small models costs more in dispatch than in arithmetic (bench/multi_policy.py). Dropout is left
    out: it is the identity in eval mode, and the engine runs the model in eval mode."""
    import torch

    a, b = _stacked_weights(state, layer)
    a_rows, b_rows = a.index_select(0, state.slots), b.index_select(0, state.slots)  # [rows, r, in], [rows, out, r]
    return torch.bmm(torch.bmm(x.to(a.dtype), a_rows.transpose(1, 2)), b_rows.transpose(1, 2))


def _stacked_weights(state: _RowAdapters, layer: Any) -> tuple[Any, Any]:
    """The layer's adapters stacked ([adapters + 1, r, in] and [adapters + 1, out, r], ranks padded with
    zeros), rebuilt when a weight changed: training updates the adapters in place between forward passes,
    which moves each tensor's version counter."""
    import torch

    present = [name for name in state.order if name in layer.lora_A]
    key = tuple((name, id(layer.lora_A[name].weight), layer.lora_A[name].weight._version,
                 id(layer.lora_B[name].weight), layer.lora_B[name].weight._version, layer.scaling[name])
                for name in present)
    cached = getattr(layer, "_agenttune_stacked", None)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2]
    rank = max(layer.lora_A[name].weight.shape[0] for name in present)
    first = layer.lora_A[present[0]].weight
    features_in, features_out = first.shape[1], layer.lora_B[present[0]].weight.shape[0]
    with torch.no_grad():
        a = first.new_zeros(len(state.order) + 1, rank, features_in)
        b = first.new_zeros(len(state.order) + 1, features_out, rank)
        for slot, name in enumerate(state.order):
            if name in layer.lora_A:
                weight_a, weight_b = layer.lora_A[name].weight, layer.lora_B[name].weight
                a[slot, : weight_a.shape[0]] = weight_a
                b[slot, :, : weight_b.shape[1]] = weight_b.to(b.dtype) * layer.scaling[name]
    layer._agenttune_stacked = (key, a, b)
    return a, b
