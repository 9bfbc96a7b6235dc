"""The model under training as an AgentScope 1.x chat model (`agentscope.model.OpenAIChatModel`).

1.x agents (`ReActAgent`) take `model` and `formatter` separately and call
`model(messages, tools=..., tool_choice=..., structured_model=...)` with already formatted dicts.
Any 1.x formatter works: DashScope's (the seeds') collapses text parts into plain strings, which is
what the gateway renders.
"""

from __future__ import annotations

from typing import Any

from agentscope.model import OpenAIChatModel


class TunedOpenAIChatModel(OpenAIChatModel):
    """`OpenAIChatModel` whose requests go to the episode's gateway, filed under `agenttune_agent`.

    Streaming, tool calls and structured output (`response_format`, with AgentScope's tool-call
    fallback) are AgentScope's own code; only the client is agenttune's.
    """

    agenttune_agent: str | None = None


def build_model(tuner: Any, *, agent: str | None, api_key: str, stream: bool | None, **kwargs: Any) -> Any:
    if stream is not None:
        kwargs["stream"] = stream
    model = TunedOpenAIChatModel(api_key=api_key, **kwargs)
    # The tuner's client reaches the gateway in process when it can (no socket) and over HTTP otherwise.
    model.client = tuner.as_async_openai_client(agent=agent)
    model.agenttune_agent = agent
    return model
