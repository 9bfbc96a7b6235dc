"""The model under training as an AgentScope 2.x chat model (`agentscope.model.OpenAIChatModel`).

2.x models own their formatter and are built from a credential:
`OpenAIChatModel(credential=OpenAICredential(api_key, base_url), model, parameters, stream, context_size)`.
The response metadata never reaches the agent's `Msg`, which is fine: the gateway records the tokens.
"""

from __future__ import annotations

from typing import Any

from agentscope.credential import OpenAICredential
from agentscope.model import OpenAIChatModel

from agenttune_agentscope.options import AgentScopeOptions


class TunedOpenAIChatModel(OpenAIChatModel):
    """`OpenAIChatModel` whose requests go to the episode's gateway, as agent `agenttune_agent`.

    `agenttune_options` carries the headless defaults that `agent_defaults` gives the agents built
    on this model.
    """

    agenttune_agent: str | None = None
    agenttune_options: AgentScopeOptions | None = None


def build_model(tuner: Any, *, agent: str | None, api_key: str, stream: bool | None,
                options: AgentScopeOptions, **kwargs: Any) -> Any:
    if stream is not None:
        kwargs["stream"] = stream
    credential = OpenAICredential(api_key=api_key, base_url=tuner.base_url)
    model = TunedOpenAIChatModel(credential=credential, **kwargs)
    # The tuner's client reaches the gateway in process when it can (no socket) and over HTTP otherwise.
    model.client = tuner.as_async_openai_client(agent=agent)
    model.agenttune_agent = agent
    model.agenttune_options = options
    return model
