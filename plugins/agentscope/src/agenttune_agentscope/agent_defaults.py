"""What agenttune adds when an AgentScope agent is constructed.

Two things, both only for agents whose model comes from agenttune:

* `model=tuner` (the seeds pass the `ModelTuner` itself) becomes `tuner.as_agentscope_model(agent=name)`,
  so each agent gets its own timeline, named after it.
* AgentScope 2.x agents get headless defaults (see `AgentScopeOptions`): tool permission mode
  `bypass` instead of asking a human, and no runtime-state injection. Only arguments the workflow
  did not pass are filled in: an explicit `state=` or `injection_config=` always wins.

This wraps the constructor of `agentscope.agent.ReActAgent` (1.x) or `agentscope.agent.Agent` (2.x),
because the workflow, not agenttune, builds the agent; installing twice is harmless.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from agenttune_agentscope.version import agentscope_line

_lock = threading.Lock()
_WRAPPED = "__agenttune_wrapped__"


def install() -> None:
    with _lock:
        if agentscope_line() == 1:
            from agentscope.agent import ReActAgent

            _wrap_init(ReActAgent, _resolve_tuner)
        else:
            from agentscope.agent import Agent

            _wrap_init(Agent, _adjust_v2_agent)


def _wrap_init(cls: type[Any], adjust: Callable[[dict[str, Any]], None]) -> None:
    original = cls.__init__
    if getattr(original, _WRAPPED, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        adjust(bound.arguments)
        original(*bound.args, **bound.kwargs)

    setattr(__init__, _WRAPPED, True)
    cls.__init__ = __init__


def _resolve_tuner(arguments: dict[str, Any]) -> None:
    model: Any = arguments.get("model")
    if _is_tuner(model):
        arguments["model"] = model.as_model("agentscope", agent=arguments.get("name"))


def _adjust_v2_agent(arguments: dict[str, Any]) -> None:
    _resolve_tuner(arguments)
    options = getattr(arguments.get("model"), "agenttune_options", None)
    if options is None or not options.headless:
        return
    from agentscope.agent import InjectionConfig
    from agentscope.permission import PermissionContext, PermissionMode
    from agentscope.state import AgentState

    if arguments.get("injection_config") is None:
        arguments["injection_config"] = InjectionConfig(inject_runtime_state=options.inject_runtime_state)
    if arguments.get("state") is None:
        mode = PermissionMode(options.permission_mode)
        arguments["state"] = AgentState(permission_context=PermissionContext(mode=mode))


def _is_tuner(model: Any) -> bool:
    """A ModelTuner, recognised by what it offers (the core must not be imported eagerly here)."""
    return callable(getattr(model, "as_model", None)) and hasattr(model, "api_key")
