"""`ModelTuner`: the workflow's handle to the model under training, one per episode.

Everything an agent needs to talk to the model goes through the tuner: an OpenAI base URL and an
episode key, ready-made OpenAI clients, or an agent framework's own model class (`as_model`, or the
`as_...` shortcut its plugin adds, such as `as_agentscope_model`). Every call made through any of them
lands on this episode's timeline in the gateway, token by token.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from agenttune.config.run import get_logger
from agenttune.errors import UserError

if TYPE_CHECKING:
    import httpx
    import openai

    from agenttune.config.models import AgentTuneConfig
    from agenttune.workflow.task import Task

log = get_logger("rollout")


class EpisodeEndpoint(Protocol):
    """What a tuner needs from its host: one episode's end of the gateway.

    The gateway's `EpisodeChannel` in the trainer's process, a `WorkerEpisode` in a workflow worker.
    Declared here so that the tuner (which workflows and agent frameworks are written against) sits
    below the gateway and the rollout engine that hand it its endpoint.
    """

    @property
    def episode_id(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def base_url(self) -> str: ...
    @property
    def context_overflow(self) -> bool: ...
    @property
    def turn_limit(self) -> bool: ...
    @property
    def engine_failing(self) -> bool: ...
    def api_key(self, agent: str | None = None) -> str: ...
    def transport(self) -> httpx.BaseTransport: ...
    def async_transport(self) -> httpx.AsyncBaseTransport: ...


class FrameworkAdapter(Protocol):
    """An agent framework as the tuner uses it (the contract is `agenttune.components.frameworks.base.AgentFramework`)."""

    def model_for(self, tuner: ModelTuner, **kwargs: Any) -> Any: ...


class FrameworkSource(Protocol):
    """Where a tuner gets agent frameworks from (the run's `agenttune.rollout.framework_loader.FrameworkLoader`).

    `get(name)` is the framework named `name`; `provider_of(method)` the name of the framework that
    adds `tuner.<method>` (in its `tuner_methods`), or None when none does.
    """

    def get(self, name: str) -> FrameworkAdapter: ...
    def provider_of(self, method: str) -> str | None: ...


class ModelTuner:
    """The model under training, as seen by one episode.

    Several agents in one episode each get their own name (`agent="critic"`): their calls form
    separate timelines, and `rollout.trainable_targets` picks whose samples are trained.
    """

    def __init__(self, channel: EpisodeEndpoint, task: Task, config: AgentTuneConfig,
                 frameworks: FrameworkSource | None = None):
        self.channel = channel
        self.task = task
        self.config = config
        self.frameworks = frameworks
        self.judge_input_dictionary: dict[str, Any] = {}
        self._clients: list[Any] = []
        self._cleanups: list[Any] = []

    # -- the endpoint ----------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """The gateway's OpenAI base URL (ends in /v1); reachable over HTTP from other processes."""
        return self.channel.base_url

    @property
    def api_key(self) -> str:
        """The episode key: send it as the API key (or use `api_key_for(agent)`)."""
        return self.channel.key

    def api_key_for(self, agent: str | None = None) -> str:
        """The key that files calls under `agent` ("default" when None)."""
        if agent is not None and (not agent or "." in agent or "/" in agent):
            raise UserError(f"Agent name {agent!r} is not allowed.",
                            hint="Use a non-empty name without '.' or '/', e.g. 'solver' or 'critic'.")
        return self.channel.api_key(agent)

    @property
    def model_name(self) -> str:
        """A model name to put in requests; the gateway accepts any."""
        return self.config.model.path or "agenttune"

    @property
    def context_overflow(self) -> bool:
        """True once a request of this episode did not fit in `model.max_model_len`: stop the loop."""
        return bool(self.channel.context_overflow)

    @property
    def turn_limit(self) -> bool:
        """True once an agent of this episode asked for more than `rollout.max_turns` calls: stop the loop."""
        return bool(self.channel.turn_limit)

    @property
    def episode_id(self) -> str:
        return self.channel.episode_id

    # -- OpenAI clients ----------------------------------------------------------------------------
    def as_openai_client(self, agent: str | None = None, *, http: bool = False, **kwargs: Any) -> openai.OpenAI:
        """A synchronous `openai.OpenAI` client for this episode.

        Calls go through an in-process transport (no socket) unless `http=True`, which uses the
        gateway's real HTTP server. `kwargs` go to `openai.OpenAI` (timeout, default_headers, ...).
        """
        import httpx
        import openai

        http_client = None if http else httpx.Client(transport=self.channel.transport())
        return self._keep(openai.OpenAI(**self._client_args(agent, http_client, kwargs)))

    def as_async_openai_client(self, agent: str | None = None, *, http: bool = False,
                               **kwargs: Any) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` client for this episode (see `as_openai_client`)."""
        import httpx
        import openai

        http_client = None if http else httpx.AsyncClient(transport=self.channel.async_transport())
        return self._keep(openai.AsyncOpenAI(**self._client_args(agent, http_client, kwargs)))

    def _client_args(self, agent: str | None, http_client: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        # No retries by default: a retried call would be a second, different sample of the same turn,
        # and an engine failure should surface as the episode's error, not be papered over.
        args = {"base_url": self.base_url, "api_key": self.api_key_for(agent), "max_retries": 0, **kwargs}
        if http_client is not None:  # None: the openai package's own HTTP client, over the socket
            args["http_client"] = http_client
        return args

    def _keep(self, client: Any) -> Any:
        self._clients.append(client)
        return client

    # -- agent frameworks ----------------------------------------------------------------------------
    def as_model(self, framework: str, **kwargs: Any) -> Any:
        """The named agent framework's model object pointed at this episode (see AgentFramework)."""
        if self.frameworks is None:
            raise UserError(f"tuner.as_model({framework!r}): this tuner was made without agent frameworks.",
                            hint="Pass `frameworks=agenttune.rollout.framework_loader.FrameworkLoader(run_dir)` "
                                 "to ModelTuner (the rollout engine always does).")
        return self.frameworks.get(framework).model_for(self, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """`tuner.as_<something>(**kwargs)` added by an agent framework plugin (its `tuner_methods`,
        e.g. `as_agentscope_model`): `as_model(<that framework>, **kwargs)`.

        Python calls this only for names the class lacks, so the tuner's own methods always win.
        """
        if not name.startswith("as_"):  # dunders too: copy and pickle probe them on a bare instance
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}",
                                 name=name, obj=self)
        # Through __dict__: while copy or pickle rebuild a tuner, `frameworks` is not set yet, and
        # `self.frameworks` would land back here.
        frameworks = self.__dict__.get("frameworks")
        provider = frameworks.provider_of(name) if frameworks is not None else None
        if provider is None:
            raise AttributeError(_no_tuner_method(type(self).__name__, name, frameworks is None),
                                 name=name, obj=self)
        method = functools.partial(self.as_model, provider)
        method.__doc__ = (f"tuner.{name}(**kwargs) is tuner.as_model({provider!r}, **kwargs): the {provider} "
                          "agent framework's model for this episode (see its model_for).")
        return method

    # -- the judge ----------------------------------------------------------------------------------------
    def update_judge_input_dictionary(self, **values: Any) -> None:
        """Hand data to the judge, e.g. `tuner.update_judge_input_dictionary(final_answer="42")`."""
        self.judge_input_dictionary.update(values)

    def add_cleanup(self, callback: Any) -> None:
        """Call `callback()` (plain or async) once the episode is over: after the judge, and also when
        the workflow failed, timed out or was cancelled. For what the judge still needs, such as an
        environment instance it evaluates (`aclose` runs before the judge). Runs last-added first."""
        self._cleanups.append(callback)

    @property
    def has_cleanups(self) -> bool:
        return bool(self._cleanups)

    async def run_cleanups(self) -> None:
        """Run the `add_cleanup` callbacks (the rollout engine calls this); a failing one is logged."""
        cleanups, self._cleanups = self._cleanups, []
        for callback in reversed(cleanups):
            await call_logged(callback, "episode cleanup", episode=self.episode_id)

    async def aclose(self) -> None:
        """Close the clients handed out (the rollout engine calls this when the episode ends)."""
        clients, self._clients = self._clients, []
        for client in clients:
            result = client.close()
            if hasattr(result, "__await__"):
                await result


def _no_tuner_method(cls: str, name: str, without_frameworks: bool) -> str:
    """Why `tuner.<name>` is missing, and what to install: agent framework plugins add such methods."""
    if without_frameworks:
        return (f"{cls!r} object has no attribute {name!r}: this tuner was made without agent frameworks, "
                "which add the `as_...` methods (pass `frameworks=FrameworkLoader(run_dir)`; the rollout "
                "engine always does).")
    framework = name.removeprefix("as_").split("_")[0] or "<framework>"
    return (f"{cls!r} object has no attribute {name!r}: no installed agent framework adds tuner.{name}(). "
            f"Install the agent framework's plugin (e.g. `pip install agenttune-plugin-{framework}`), "
            "and see `agenttune plugins list` for the plugins installed and any that failed to load.")


async def call_logged(step: Callable[[], Any], what: str, **context: Any) -> None:
    """Run (and await) a cleanup step that must not turn a finished episode into a crash."""
    try:
        result = step()
        if inspect.isawaitable(result):
            await result
    except Exception as error:
        log.warning(f"{what} failed", error=f"{type(error).__name__}: {error}", **context)
