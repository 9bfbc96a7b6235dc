"""A verifiers 0.1-0.3 environment from its id and `load_environment` arguments, once per process."""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

from agenttune.plugin_api import UserError

_ENVS: dict[str, Any] = {}
_LOCK = threading.Lock()  # the reader runs in its own thread, judges in workers: build each env once

INSTALL_HINT = ("Install the environment into this Python first: a hub environment with `prime env install "
                "owner/name` (or `pip install` of its package), a local one with `pip install -e path/to/env`; "
                "then name it by its id in task_reader.id (docs/verifiers.md).")


def load_legacy_env(spec: dict[str, Any]) -> Any:
    """The Environment for `{"id", "args", "max_turns", "timeout"}` (the same object for the same spec)."""
    key = json.dumps(spec, sort_keys=True, default=str)
    with _LOCK:
        if key not in _ENVS:
            _ENVS[key] = _build(spec)
        return _ENVS[key]


def _build(spec: dict[str, Any]) -> Any:
    import verifiers as vf

    _keep_signal_handlers()
    env_id = spec["id"]
    try:
        env = vf.load_environment(env_id, **spec["args"])
    except ValueError as error:  # verifiers' "Could not import" wraps the ImportError
        cause = error.__cause__
        if isinstance(cause, ModuleNotFoundError) and cause.name and cause.name != _module_name(env_id):
            raise UserError(f"The verifiers environment {env_id!r} is installed, but importing it failed: {cause}.",
                            hint=f"Install what it needs (`pip install {cause.name.split('.')[0]}` or the "
                                 "environment's own requirements).") from error
        raise UserError(f"The verifiers environment {env_id!r} cannot be imported: {_one_line(str(error))}.",
                        hint=INSTALL_HINT) from error
    except Exception as error:  # its load_environment raised (bad args, its own bug): one paragraph
        raise UserError(f"Loading the verifiers environment {env_id!r} with args {spec['args']} failed: "
                        f"{_one_line(str(error))}.",
                        hint="Check task_reader.args / split_args against its load_environment's parameters.") from error
    _apply_limits(env, spec)
    return env


class _SignalsLeftAlone:
    """Stands in for the `signal` module inside verifiers' Environment: its `signal.signal` does nothing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    @staticmethod
    def signal(signalnum: int, handler: Any) -> None:
        return None


def _keep_signal_handlers() -> None:
    """Every 0.1-0.3 Environment sets SIGINT/SIGTERM handlers when built. That fails outside the main thread
    (agenttune's readers and judges run in threads) and would replace the trainer's own shutdown handling;
    its teardown still runs at exit (atexit), so the handlers are left as agenttune set them."""
    import verifiers.legacy.envs.environment as environment

    environment.signal = _SignalsLeftAlone()


def _apply_limits(env: Any, spec: dict[str, Any]) -> None:
    """task_reader.max_turns / rollout_timeout override the environment's own (MultiTurnEnv's attributes)."""
    if spec.get("max_turns") is not None:
        env.max_turns = spec["max_turns"]
    if spec.get("timeout") is not None:
        env.timeout_seconds = spec["timeout"]


def _module_name(env_id: str) -> str:
    """The module verifiers imports for an id (as its env_utils does)."""
    return env_id.replace("-", "_").split("/")[-1]


def _one_line(text: str) -> str:
    return " ".join(text.split())[:1500]
