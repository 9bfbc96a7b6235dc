"""Resolve `package.module:Name` references to Python objects.

The older spelling `package.module->Name` (used by ASTune configs) is accepted too.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from agenttune.config.install_hints import import_hint
from agenttune.errors import UserError


def split_reference(reference: str, key: str | None = None) -> tuple[str, str]:
    """Split `pkg.mod:Name` (or `pkg.mod->Name`) into module path and attribute path."""
    where = f"{key}: " if key else ""
    for separator in (":", "->"):
        if separator in reference:
            module, _, attribute = reference.partition(separator)
            if module.strip() and attribute.strip():
                module = module.strip()
                if module.endswith(".py") or "/" in module or "\\" in module:
                    raise UserError(
                        f"{where}{reference!r} names a file; a code reference names a module.",
                        hint=f"Write {_as_module(module)}:{attribute.strip()} (the module's name, without the "
                             "path and .py); modules next to the config file and in the current directory are found.")
                return module, attribute.strip()
    raise UserError(
        f"{where}{reference!r} is not a code reference.",
        hint="Write it as 'package.module:Name', e.g. 'my_agent.workflow:MathWorkflow'.",
    )


def _as_module(path: str) -> str:
    return Path(path.replace("\\", "/")).with_suffix("").as_posix().strip("./").replace("/", ".") or "module"


def load_reference(reference: str, *, key: str = "reference", search_path: Path | None = None) -> Any:
    """Import the module of `reference` and return the named attribute.

    `search_path` (usually the config file's directory) is tried first, so a workflow next to its
    YAML file is found without installing it. `key` names the config key in error messages.
    """
    module_name, attribute_path = split_reference(reference, key)
    if search_path is not None and str(search_path) not in sys.path:
        sys.path.insert(0, str(search_path))
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if _is_the_module_itself(error, module_name):
            raise UserError(
                f"{key}: cannot import module {module_name!r} from {reference!r} ({error}).",
                hint="Check the spelling, and run from the directory that contains the package or install it.",
            ) from error
        raise UserError(
            f"{key}: importing {module_name!r} needs {error.name!r}, which is not installed ({error}).",
            hint=import_hint(error) or f"Install the package that provides {error.name!r}.",
        ) from error
    except UserError as error:  # the module said itself what is wrong and how to fix it (e.g. a version check)
        raise UserError(f"{key}: importing {module_name!r}: {error.message}", hint=error.hint) from error
    except Exception as error:  # the user's module raised while importing: show what and where
        raise UserError(
            f"{key}: importing {module_name!r} raised {type(error).__name__}: {error}.",
            hint=(import_hint(error) if isinstance(error, ImportError) else None)
            or "Fix the error in that module (run with --debug to see the traceback).",
        ) from error
    for part in attribute_path.split("."):
        if not hasattr(target, part):
            available = sorted(name for name in dir(target) if not name.startswith("_"))[:12]
            raise UserError(
                f"{key}: module {module_name!r} has no attribute {part!r} (from {reference!r}).",
                hint=f"Names it defines include: {', '.join(available) or 'none'}.",
            )
        target = getattr(target, part)
    return target


def _is_the_module_itself(error: ModuleNotFoundError, module_name: str) -> bool:
    """Whether the missing module is `module_name` (or a package on its path), not one it imports."""
    missing = error.name or ""
    return not missing or module_name == missing or module_name.startswith(missing + ".")
