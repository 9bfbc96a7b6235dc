"""Which verifiers stack this Python has: 0.4's `verifiers.v1` or the 0.1-0.3 `load_environment(**kw)` one.

The two cannot share a Python (0.4 dropped the old API; 0.3.1's `verifiers.v1` is an earlier, different
one), so the installed version decides how an environment is loaded, rolled out and scored.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Literal

from agenttune.plugin_api import UserError

Stack = Literal["v1", "legacy"]


def installed_stack() -> Stack:
    """`legacy` for verifiers 0.1-0.3, `v1` for 0.4 (read from the installed distribution, not imported)."""
    try:
        installed = version("verifiers")
    except PackageNotFoundError as error:
        raise UserError("The verifiers plugin is installed without verifiers.",
                        hint="Install one of its stacks: `pip install 'agenttune-plugin-verifiers[v04]'` for "
                             "verifiers 0.4 environments, `[v03]` for 0.1-0.3 ones (docs/verifiers.md).") from error
    major, minor = (int(part) for part in installed.split(".")[:2])
    return "legacy" if (major, minor) < (0, 4) else "v1"
