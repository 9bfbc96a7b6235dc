"""A verifiers environment built from its config, once per process, with install and config mistakes as one paragraph."""

from __future__ import annotations

import json
import threading
from typing import Any

from agenttune.plugin_api import UserError
from agenttune_verifiers.options import CHAT_HARNESS

_ENVS: dict[str, Any] = {}
_LOCK = threading.Lock()  # readers run in their own thread; judges in workers: build each env once

INSTALL_HINT = ("Install the environment into this Python first: a hub environment with `prime env install "
                "owner/name` (or `pip install` of its package), a local one with `pip install -e path/to/env`; "
                "then name it by its id in task_reader.id (docs/verifiers.md).")


def load_env(config: dict[str, Any]) -> Any:
    """The verifiers `Env` for an EnvConfig given as plain data (the same object for the same config)."""
    key = json.dumps(config, sort_keys=True, default=str)
    with _LOCK:
        if key not in _ENVS:
            _ENVS[key] = _build(config)
        return _ENVS[key]


def _build(config: dict[str, Any]) -> Any:
    from pydantic import ValidationError
    from verifiers.v1.utils.loaders import default_harness_id, env_config_type, load_environment

    taskset_id = config["taskset"]["id"]
    config = {**config, "agent": dict(config.get("agent") or {})}
    try:
        if "harness" not in config["agent"] and default_harness_id(taskset_id) == "bash":
            config["agent"]["harness"] = {"id": CHAT_HARNESS}  # the taskset bundles no harness of its own
        env_config = env_config_type(taskset_id, config.get("id", "")).model_validate(config)
        return load_environment(env_config)
    except ModuleNotFoundError as error:
        inner = _innermost(error)
        if inner.name and inner.name.split(".")[0] != _module_name(taskset_id):
            raise UserError(f"The verifiers environment {taskset_id!r} is installed, but importing it failed: {inner}.",
                            hint=f"Install what it needs (`pip install {inner.name.split('.')[0]}` or the "
                                 "environment's own requirements).") from error
        raise UserError(f"The verifiers environment {taskset_id!r} cannot be imported: {error}.",
                        hint=INSTALL_HINT) from error
    except ValidationError as error:
        raise UserError(f"The verifiers environment {taskset_id!r} refuses its config: "
                        f"{_one_line(str(error))}.",
                        hint="Check task_reader.args / split_args against the taskset's config fields.") from error
    except Exception as error:  # the environment's own code raised while loading: its message, in one paragraph
        raise UserError(f"Loading the verifiers environment {taskset_id!r} failed: {type(error).__name__}: "
                        f"{_one_line(str(error))}.", hint=INSTALL_HINT) from error


def _innermost(error: ModuleNotFoundError) -> ModuleNotFoundError:
    """verifiers re-raises an environment's failed import as "not found"; the cause names the real missing module."""
    while isinstance(error.__cause__, ModuleNotFoundError):
        error = error.__cause__
    return error


def _module_name(taskset_id: str) -> str:
    """The module verifiers imports for an id (`owner/name@version` -> name, dashes as underscores)."""
    return taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _one_line(text: str) -> str:
    return " ".join(text.split())[:1500]


def task_from_data(env: Any, data: dict[str, Any]) -> Any:
    """The verifiers Task an agenttune task carries (its wire data), with the taskset's task config."""
    task_cls = type(env.taskset).task_type()
    return task_cls(task_cls.data_type().model_validate(data), env.taskset.config.task)
