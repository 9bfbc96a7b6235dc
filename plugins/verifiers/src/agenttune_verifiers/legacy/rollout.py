"""One episode of a verifiers 0.1-0.3 environment: its own `rollout`, its model calls through the gateway.

The environment's client is verifiers' OpenAIChatCompletionsClient on this episode's gateway URL (the
key in the path), so every turn, tool calls and the environment's own replies included, is recorded
token by token as sampled. Scoring is left to the `verifiers` judge (scoring.py), which gets the
rollout's state as plain data.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

from agenttune.plugin_api import EnvironmentFailure, ModelTuner
from agenttune_verifiers.legacy.loading import load_legacy_env

# verifiers reads the API key from this variable; left unset it sends "EMPTY": the key is in the URL path.
_UNSET_KEY_VARIABLE = "AGENTTUNE_VERIFIERS_UNUSED_KEY"
# State keys that are live objects of this process (the client, a usage counter): never sent to the judge.
_LIVE_KEYS = {"client", "usage_tracker"}
# State keys every rollout has; the others are the environment's own (shown in the rollout log).
_STANDARD_KEYS = {"input", "task", "prompt", "completion", "answer", "info", "example_id", "model", "sampling_args",
                  "is_completed", "is_truncated", "stop_condition", "tool_defs", "trajectory", "reward", "metrics",
                  "error", "final_env_response", "timing", "trajectory_id", "usage", "timed_out", "prompt_too_long",
                  "advantage", *_LIVE_KEYS}


class LegacyRolloutError(RuntimeError):
    """The model's side of the rollout failed (its reply or tool call was unusable): a workflow_error."""


async def run_legacy_episode(spec: dict[str, Any], tuner: ModelTuner) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rollout's state as data for the judge, and its summary for the rollout log.

    Raises EnvironmentFailure when the environment failed it (its code raised, its tools or
    infrastructure broke), LegacyRolloutError when the model's output did.
    """
    from verifiers.legacy.clients import OpenAIChatCompletionsClient
    from verifiers.legacy.errors import Error
    from verifiers.legacy.types import ClientConfig

    env = load_legacy_env(spec["env"])
    # max_retries 0: a retried call would be recorded twice on the episode's timeline
    client = OpenAIChatCompletionsClient(ClientConfig(api_base_url=_keyed_url(tuner), api_key_var=_UNSET_KEY_VARIABLE,
                                                      max_retries=0))
    try:
        state = await env.rollout(dict(spec["row"]), client, tuner.model_name, None)
    except Error as error:
        raise classify(error) from error
    except Exception as error:  # the environment's own code raised (setup_state, env_response, a stop condition)
        raise EnvironmentFailure(f"{_snake(type(error).__name__)}: {_one_line(str(error))}") from error
    finally:
        await client.close()
    summary = state_summary(state)
    if state.get("error") is not None:
        raise classify(state["error"])
    return sendable_state(state), summary


def classify(error: BaseException) -> Exception:
    """The model's failures stay workflow errors; everything else the environment did is environment_error."""
    from verifiers.legacy.errors import ModelError, OverlongPromptError, ToolParseError

    text = f"{_snake(type(error).__name__)}: {_one_line(str(error) or repr(error.__cause__))}"
    if isinstance(error, ModelError | ToolParseError | OverlongPromptError):
        return LegacyRolloutError(text)
    return EnvironmentFailure(text)


def sendable_state(state: Any) -> dict[str, Any]:
    """The state's keys that a judge worker process can receive (pickled), live objects left out."""
    sendable = {}
    for key, value in dict(state).items():
        if key in _LIVE_KEYS:
            continue
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - an object of this process only (a lock, a connection): not sent
            continue
        sendable[key] = value
    return sendable


def state_summary(state: Any) -> dict[str, Any]:
    """A JSON-able digest for the rollout log: stop reason, tool calls, the environment's own state keys."""
    completion = state.get("completion") or []
    tool_calls = [{"name": call.name, "arguments": call.arguments}
                  for message in completion if getattr(message, "role", None) == "assistant"
                  for call in (getattr(message, "tool_calls", None) or [])]
    error = state.get("error")
    return {
        "stop_condition": state.get("stop_condition"),
        "is_truncated": bool(state.get("is_truncated")),
        "timed_out": bool(state.get("timed_out")),
        "num_turns": len(state.get("trajectory") or []),
        "tool_calls": tool_calls,
        "state": {key: value for key, value in dict(state).items() if key not in _STANDARD_KEYS and _is_json(value)},
        "error": None if error is None else f"{type(error).__name__}: {error}",
    }


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _keyed_url(tuner: ModelTuner) -> str:
    """The gateway URL with this episode's key in the path: verifiers' client sends a fixed API key."""
    return f"{tuner.base_url.removesuffix('/v1')}/e/{tuner.api_key}/v1"


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def _one_line(text: str) -> str:
    return " ".join(text.split())[:1500]
