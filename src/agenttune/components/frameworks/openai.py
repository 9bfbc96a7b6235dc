"""The built-in `openai` agent framework: any agent written against the `openai` client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from agenttune.components.frameworks.base import AgentFramework

if TYPE_CHECKING:
    from agenttune.workflow.tuner import ModelTuner


class OpenAIFramework(AgentFramework):
    """`tuner.as_model("openai")` is an `openai.AsyncOpenAI` client for the episode.

    Options: `agent` (the agent name for multi-agent episodes), `asynchronous=False` for a
    synchronous `openai.OpenAI`, `http=True` to go over the socket instead of in-process; other
    keyword arguments go to the client's constructor. Plain OpenAI-client code needs no framework
    at all: `tuner.as_openai_client()` / `tuner.as_async_openai_client()` are the same clients.
    """

    name: ClassVar[str] = "openai"

    def model_for(self, tuner: ModelTuner, *, agent: str | None = None, asynchronous: bool = True,
                  http: bool = False, **kwargs: Any) -> Any:
        make = tuner.as_async_openai_client if asynchronous else tuner.as_openai_client
        return make(agent, http=http, **kwargs)
