"""The model under training as an AgentScope 1.x chat model (`agentscope.model.OpenAIChatModel`).

1.x agents (`ReActAgent`) take `model` and `formatter` separately and call
`model(messages, tools=..., tool_choice=..., structured_model=...)` with already formatted dicts.
"""

from __future__ import annotations

from typing import Any

from agentscope.model import OpenAIChatModel

from agenttune_agentscope.messages import openai_messages


class TunedOpenAIChatModel(OpenAIChatModel):
    """`OpenAIChatModel` whose requests go to the episode's gateway, as agent `agenttune_agent`.

    The only behaviour it adds: messages from any 1.x formatter (the seeds use DashScope's) are put
    in OpenAI's shape before they are sent. Everything else - streaming, tool calls, structured
    output through `response_format` with its tool-call fallback - is AgentScope's own code.
    """

    agenttune_agent: str | None = None

    async def __call__(self, messages: list[dict], *args: Any, **kwargs: Any) -> Any:
        return await super().__call__(openai_messages(messages), *args, **kwargs)


def build_model(tuner: Any, *, agent: str | None, api_key: str, stream: bool | None, **kwargs: Any) -> Any:
    if stream is not None:
        kwargs["stream"] = stream
    model = TunedOpenAIChatModel(model_name=kwargs.pop("model_name"), api_key=api_key, **kwargs)
    # The tuner's client reaches the gateway in process when it can (no socket) and over HTTP otherwise.
    model.client = tuner.as_async_openai_client(agent=agent)
    model.agenttune_agent = agent
    return model
