"""AWorld agents pointed at the model under training.

An AWorld agent reaches its model through `conf.llm_config` (provider, model name, base URL, API key);
the `openai` provider pointed at the gateway with the episode key makes every call of the agent a
recorded, trainable call. Three ways to get there:

    AgentConfig for a new agent    tuner.as_aworld_config()  /  llm_config(tuner)
    an agent you built              point_agent_at(agent, tuner)        (changes it in place)
    a template for every episode    episode_agent(template_or_factory, tuner)

An Agent keeps per-run state, so concurrent episodes must not share one: `episode_agent` calls a
factory, or rebuilds a template Agent from its settings, once per episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agenttune.plugin_api import UserError

if TYPE_CHECKING:
    from agenttune.plugin_api import ModelTuner

# AWorld retries a failed LLM call after 10 s, 20 s, ...; agenttune does not retry: a retried call is a
# second, different sample of the same turn, and a failure should end the episode with its status.
LLM_MAX_ATTEMPTS = 1
LLM_CLIENT_RETRIES = 0


def llm_settings(tuner: ModelTuner, agent: str | None = None) -> dict[str, Any]:
    """The AWorld `llm_config` fields that point a model at this episode's gateway endpoint."""
    return {
        "llm_provider": "openai",
        "llm_model_name": tuner.model_name,
        "llm_base_url": tuner.base_url,
        "llm_api_key": tuner.api_key_for(agent),
        "max_retries": LLM_CLIENT_RETRIES,
    }


def llm_config(tuner: ModelTuner, agent: str | None = None, **kwargs: Any) -> Any:
    """An `aworld.config.AgentConfig` for this episode; `kwargs` are other AgentConfig fields."""
    from aworld.config import AgentConfig

    given = sorted(set(kwargs) & set(llm_settings(tuner, agent)))
    if given:
        raise UserError(f"as_aworld_config() got {', '.join(given)}, but the model under training is reached through "
                        "agenttune's gateway with the episode's own key.",
                        hint="Drop those arguments; other AgentConfig fields (max_steps, llm_temperature, ...) are fine.")
    return AgentConfig(**llm_settings(tuner, agent), **kwargs)


def point_agent_at(aworld_agent: Any, tuner: ModelTuner, agent: str | None = None) -> Any:
    """Point an existing AWorld Agent's LLM at this episode (in place); returns the agent."""
    settings = llm_settings(tuner, agent)
    llm = aworld_agent.conf.llm_config
    for key, value in settings.items():
        llm[key] = value
    aworld_agent.model_name = settings["llm_model_name"]
    aworld_agent._llm = None  # AWorld builds its model client lazily from conf.llm_config: build it again
    if hasattr(aworld_agent, "llm_max_attempts"):
        aworld_agent.llm_max_attempts = LLM_MAX_ATTEMPTS
    return aworld_agent


def episode_agent(source: Any, tuner: ModelTuner, agent: str | None = None) -> Any:
    """A new AWorld agent for this episode: `source()` when it is a factory, else a rebuilt copy of it."""
    from aworld.agents.llm_agent import Agent
    from aworld.core.agent.base import BaseAgent

    if isinstance(source, Agent):
        built = rebuilt(source)
    elif isinstance(source, BaseAgent):
        raise UserError(f"aworld.agent is a {type(source).__name__}, which agenttune cannot copy for each episode.",
                        hint="Point aworld.agent at a function that returns a new agent instead.")
    elif callable(source):
        built = source()
        if not isinstance(built, BaseAgent):
            raise TypeError(f"the agent factory {_name(source)} returned {type(built).__name__}, not an AWorld Agent")
    else:
        raise UserError(f"aworld.agent names a {type(source).__name__}, not an AWorld Agent.",
                        hint="Point it at an Agent, or at a function that returns a new Agent.")
    return point_agent_at(built, tuner, agent)


def rebuilt(template: Any) -> Any:
    """A new agent of the template's class, made with the settings the template was made with."""
    from aworld.config import ConfigDict

    conf = ConfigDict(_copied(template.conf))
    try:
        built = _construct(type(template), template, conf)
    except TypeError as error:  # a subclass with constructor arguments of its own
        raise UserError(f"Cannot rebuild the {type(template).__name__} agent {template.name()!r} for each episode "
                        f"from its settings ({error}).",
                        hint="Point aworld.agent (or AgentTrainer's agent) at a function that returns a new agent.") from error
    # The constructor appends tools that the config implies (human tools, skills); the template's list
    # already had them.
    built.tool_names = list(dict.fromkeys(built.tool_names))
    return built


def _construct(cls: type, template: Any, conf: Any) -> Any:
    return cls(
        name=template.name(),
        conf=conf,
        desc=template.desc(),
        tool_names=list(template.tool_names),
        agent_names=list(template.handoffs),
        mcp_servers=list(template.mcp_servers),
        mcp_config=_copied(template.mcp_config),
        black_tool_actions=_copied(template.black_tool_actions),
        feedback_tool_result=template.feedback_tool_result,
        wait_tool_result=template.wait_tool_result,
        system_prompt=template.system_prompt,
        need_reset=template.need_reset,
        step_reset=template.step_reset,
        use_tools_in_prompt=template.use_tools_in_prompt,
        model_output_parser=template.output_converter,
        event_handler_name=template.event_handler_name,
        event_driven=template.event_driven,
        llm_retry_delay=template.llm_retry_delay,
        max_loop_steps=template.max_loop_steps,
    )


def _copied(value: Any) -> Any:
    """Nested dicts and lists copied (AWorld's ConfigDict cannot be deep-copied); other values shared."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", repr(function))
