"""Python objects handed to the Python API, under names a config can reference.

A configuration names code as `package.module:Name`. `agenttune.Trainer(workflow=MyWorkflow,
train_dataset=rows)` may be given objects that no module path reaches: a class defined in a script
run as `__main__` or inside a function, a `datasets.Dataset` built in memory. `reference_for(obj)`
returns the object's own `module:Name` when that imports back to the very same object, and otherwise
keeps the object here and returns `agenttune.config.in_process:Name_N`, which `load_reference` resolves
like any other reference, in this process.

Such references exist only in the process that made them: a backbone whose workflows run in other
processes (verl and trinity, through Ray) needs importable code and data files instead.
"""

from __future__ import annotations

import importlib
import itertools
import re
from typing import Any

MODULE = __name__
_objects: dict[str, Any] = {}
_numbers = itertools.count(1)


def reference_for(obj: Any, *, label: str | None = None) -> str:
    """A `module:Name` reference that loads `obj` (kept here when nothing else reaches it)."""
    own = importable_reference(obj)
    if own is not None:
        return own
    return keep(obj, label=label)


def keep(obj: Any, *, label: str | None = None) -> str:
    """Keep `obj` for the life of this process; return the reference that loads it."""
    base = re.sub(r"\W", "_", label or getattr(obj, "__name__", None) or type(obj).__name__).strip("_") or "object"
    name = f"{base}_{next(_numbers)}"
    _objects[name] = obj
    return f"{MODULE}:{name}"


def importable_reference(obj: Any) -> str | None:
    """`module:qualname` when importing that gives back `obj` itself (not for `__main__`)."""
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module_name or not qualname or module_name == "__main__" or "<" in qualname:
        return None
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        return None
    return f"{module_name}:{qualname}" if target is obj else None


def __getattr__(name: str) -> Any:
    try:
        return _objects[name]
    except KeyError:
        raise AttributeError(
            f"{MODULE}:{name} is a Python object handed to agenttune's Python API in another process; "
            "it exists only there"
        ) from None


def __dir__() -> list[str]:
    return sorted(_objects)
