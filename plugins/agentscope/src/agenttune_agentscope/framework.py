"""The `agentscope` agent framework: `tuner.as_agentscope_model()` and friends."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agenttune.plugin_api import AgentFramework, UserError
from agenttune_agentscope.options import AgentScopeOptions
from agenttune_agentscope.version import agentscope_line

if TYPE_CHECKING:
    from agenttune.plugin_api import ModelTuner

# The client is agenttune's (it knows the gateway and the episode key); these would be ignored.
_CLIENT_ARGUMENTS = ("client_args", "client_kwargs", "credential", "api_key")


class AgentScopeFramework(AgentFramework):
    """Hands AgentScope agents (1.x `ReActAgent`, 2.x `Agent`) the model under training.

    `model_for(tuner, agent=None, stream=None, **kwargs)` returns the installed line's
    `OpenAIChatModel` wired to the episode's gateway endpoint. `agent` names the timeline the calls
    are recorded on (multi-agent workflows give each agent its own name; `rollout.trainable_targets`
    picks which are trained). Other keyword arguments go to `OpenAIChatModel` unchanged
    (1.x: `generate_kwargs`, `reasoning_effort`, ...; 2.x: `parameters`, `formatter`, `context_size`, ...).
    Workflows call it as `tuner.as_agentscope_model(...)` (this class's `tuner_methods`).
    """

    name = "agentscope"
    tuner_methods = ("as_agentscope_model",)

    def setup(self, run_dir: Path) -> None:
        from agenttune_agentscope.agent_defaults import install

        install()

    def model_for(self, tuner: ModelTuner, *, agent: str | None = None, stream: bool | None = None,
                  **kwargs: Any) -> Any:
        given = [name for name in _CLIENT_ARGUMENTS if name in kwargs]
        if given:
            raise UserError(
                f"as_agentscope_model() got {', '.join(given)}, but the model under training is reached "
                "through agenttune's gateway with the episode's own key and client.",
                hint="Drop those arguments; pass sampling settings (generate_kwargs / parameters) instead.",
            )
        from agenttune_agentscope.agent_defaults import install

        install()  # also when no backbone called setup(), e.g. a workflow driven from a test
        options = _options(tuner)
        stream = options.stream if stream is None else stream
        common: dict[str, Any] = {"agent": agent, "api_key": tuner.api_key_for(agent), "stream": stream}
        if agentscope_line() == 1:
            from agenttune_agentscope import v1

            kwargs.setdefault("model_name", tuner.model_name)
            return v1.build_model(tuner, **common, **kwargs)
        from agenttune_agentscope import v2

        kwargs.setdefault("model", tuner.model_name)
        kwargs.setdefault("context_size", options.context_size or compression_context_size(tuner.config))
        return v2.build_model(tuner, **common, options=options, **kwargs)


# Tokens the agent's own count does not see (the chat template's glue, the tools' rendering).
CONTEXT_MARGIN = 64


def compression_context_size(config: Any) -> int:
    """AgentScope 2.x compresses its memory at `trigger_ratio` x `context_size` tokens. The gateway refuses a
    call once prompt + the reply's budget pass model.max_model_len, so the context size leaves room for the
    reply (and a margin): the agent compresses before the gateway has to refuse."""
    model_len, reply = config.model.max_model_len, config.rollout.max_response_length_in_one_turn
    return max(model_len - reply - CONTEXT_MARGIN, 1)


def _options(tuner: ModelTuner) -> AgentScopeOptions:
    """The `agentscope:` section of the run's config (its defaults when the config has none)."""
    return tuner.config.section("agentscope", AgentScopeOptions)
