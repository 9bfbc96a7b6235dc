"""The OpenEnv environment of one episode: one server-side session, `reset()` then `step(action)`.

In a workflow:

    from agenttune_openenv import openenv_for

    async def execute(self, task, tuner):
        env = openenv_for(task, tuner)
        result = await env.reset()                 # the episode's instance is created here
        while not result.done:
            action = {"message": ...}               # the agent's move, in the environment's action schema
            result = await env.step(action)         # result.observation, result.reward, result.done
        return WorkflowOutput()                     # the `openenv` judge turns the rewards into the reward

One OpenEnv session is one WebSocket connection to the server's /ws, and the server gives each its own
environment instance (HTTP /reset and /step build a fresh instance per request, so an episode cannot
use them). `openenv_for` hands the session to the judge (as `openenv`) and closes it when the episode
is over: after the judge, and also when the workflow raised, timed out or was cancelled; closing the
connection is what makes the server drop the instance. Every call has a timeout. A server that is down,
never answers, or drops the connection raises `EnvironmentFailure`: the episode ends with status
`environment_error`. A server that is full (CAPACITY_REACHED: it serves its max_concurrent_envs
sessions) is tried again, with growing pauses, for up to `capacity_wait` seconds; a launched server
that is being restarted is waited for (`restart_wait`). An MCP tool environment's tools are
`await env.list_tools()` and `await env.call_tool(name, arguments)` (a step).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from agenttune.plugin_api import EnvironmentFailure, UserError, get_logger
from agenttune_openenv.news import restarting, server_news, wait_while_restarting

if TYPE_CHECKING:
    from openenv.core import GenericEnvClient

    from agenttune.plugin_api import ModelTuner, Task

log = get_logger("openenv.session")

METADATA_KEY = "openenv"
HANDED_KEY = "openenv"  # the judge input under which the session is handed to the judge
URL_VARIABLE = "AGENTTUNE_OPENENV_URL"  # exported by the launcher for the length of a run
CLOSE_TIMEOUT_S = 10.0  # closing is cleanup: bounded even when the server is gone
# openenv's error code (WSErrorCode) for a session refused because the server serves max_concurrent_envs already.
CAPACITY_CODE = "CAPACITY_REACHED"
# Pauses between tries at a full server: doubling, and jittered so that the episodes waiting do not
# all knock at once when a session frees up.
FIRST_PAUSE_S = 0.25
LONGEST_PAUSE_S = 5.0


class ServerFull(EnvironmentFailure):
    """The server refused a new session: it already serves as many as it allows (`limit`, when it said)."""

    def __init__(self, message: str, limit: int | None):
        super().__init__(message)
        self.limit = limit


class OpenEnvSpec(BaseModel):
    """Where a task's environment lives and how its episode starts; kept in `task.metadata['openenv']`."""

    url: str | None = Field(default=None, description=f"Base URL of the server. Default: ${URL_VARIABLE}, which "
                                                      "the run sets from the openenv: section.")
    reset: dict[str, Any] = Field(default_factory=dict,
                                  description="Keyword arguments of the environment's reset (seed, episode_id, ...).")
    connect_timeout: float = Field(default=10.0, gt=0, description="Seconds to open the session.")
    message_timeout: float = Field(default=60.0, gt=0, description="Seconds one reset, step or state may take.")
    restart_wait: float = Field(default=120.0, ge=0, description="Seconds a new episode waits for a launched "
                                                                 "server that died to be started again.")
    capacity_wait: float = Field(default=300.0, ge=0, description="Seconds a new episode waits for a free session "
                                                                  "while the server is full (max_concurrent_envs).")

    @classmethod
    def of(cls, task: Task, **overrides: Any) -> OpenEnvSpec:
        stored = task.metadata.get(METADATA_KEY) or {}
        given = {key: value for key, value in overrides.items() if value is not None}
        spec = cls.model_validate({**stored, **given})
        if not spec.url:
            spec.url = os.environ.get(URL_VARIABLE)
        if not spec.url:
            raise UserError(
                f"Task {task.task_id!r} does not say which OpenEnv server it belongs to: no url in "
                f"task.metadata[{METADATA_KEY!r}], no url= given and ${URL_VARIABLE} is not set.",
                hint="Configure the openenv: section (app, command or url), or pass url= to openenv_for().")
        return spec


class StepResult(BaseModel):
    """What reset() and step() return: the environment's observation, its reward and whether it is done."""

    observation: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)


class OpenEnvSession:
    """One OpenEnv session (one environment instance on the server) for one episode."""

    def __init__(self, spec: OpenEnvSpec, task_id: str):
        self.spec = spec
        self.task_id = task_id
        self.url = (spec.url or "").rstrip("/")
        self.rewards: list[float] = []  # every step's reward, None counted as 0
        self.steps = 0
        self.done = False
        self.opened = False
        self.closed = False
        self.last: StepResult | None = None
        self.capacity_waits = 0  # how often reset found the server full and waited
        self._client: GenericEnvClient | None = None

    async def reset(self, **kwargs: Any) -> StepResult:
        """Open the session and reset its environment (with the task's reset arguments, then `kwargs`)."""
        if self.opened:
            raise RuntimeError(f"OpenEnv session for {self.task_id} was already reset: one instance per episode")
        self._check_not_closed()
        self.opened = True  # before the call: a session half-opened must still be closed
        arguments = {**self.spec.reset, **kwargs}
        await wait_while_restarting(self.url, self.spec.restart_wait)
        result = await self._open_when_possible(arguments)
        self.done = result.done
        return result

    async def _open_when_possible(self, arguments: dict[str, Any]) -> StepResult:
        """Open and reset. While the server is full, try again until `capacity_wait` is over; when it died
        and the launcher is starting it again, wait for that and try once more."""
        deadline = time.monotonic() + self.spec.capacity_wait
        pause = FIRST_PAUSE_S
        waited_for_restart = False
        while True:
            try:
                return await self._open_and_reset(arguments)
            except ServerFull as full:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._still_full(full) from full
                if not self.capacity_waits:
                    log.info("the OpenEnv server is full; waiting for a free session", url=self.url,
                             task_id=self.task_id, capacity_wait=self.spec.capacity_wait)
                self.capacity_waits += 1
                await asyncio.sleep(min(pause * random.uniform(0.5, 1.0), left))
                pause = min(2 * pause, LONGEST_PAUSE_S)
            except EnvironmentFailure:
                if waited_for_restart or not restarting(self.url):
                    raise
                # The server died between the wait and the call, and is coming back: wait, then once more.
                waited_for_restart = True
                await wait_while_restarting(self.url, self.spec.restart_wait)

    def _still_full(self, full: ServerFull) -> EnvironmentFailure:
        limit = f"at most {full.limit} session{'s' * (full.limit != 1)}" if full.limit is not None else \
            "no more sessions"
        fewer = f"{full.limit} or fewer" if full.limit is not None else "fewer"
        return EnvironmentFailure(
            f"the OpenEnv server at {self.url} stayed full for capacity_wait={self.spec.capacity_wait:g}s: it "
            f"serves {limit} at once (its max_concurrent_envs) and none became free for task {self.task_id}. "
            f"Run {fewer} episodes at once (rollout.max_env_worker, debug.max_parallel), let the server take "
            "more (create_app(..., max_concurrent_envs=N) with SUPPORTS_CONCURRENT_SESSIONS = True), or wait "
            "longer: task_reader.capacity_wait (OpenEnvSpec.capacity_wait, openenv_for(capacity_wait=...)). "
            f"The server said: {full}")

    async def _open_and_reset(self, arguments: dict[str, Any]) -> StepResult:
        if self._client is not None:
            await _close_quietly(self._client)
        self._client = self._new_client()
        return await self._call("reset", self._client.reset(**arguments))

    async def step(self, action: dict[str, Any]) -> StepResult:
        """Send one action (a dict in the environment's action schema); the reward is kept for the judge."""
        self._check_live()
        assert self._client is not None
        result = await self._call("step", self._client.step(action))
        self.steps += 1
        self.rewards.append(float(result.reward or 0.0))
        self.done = result.done
        return result

    async def list_tools(self) -> list[dict[str, Any]]:
        """An MCP tool environment's tools (name, description, input_schema). Not a step: it has no reward."""
        self._check_live()
        assert self._client is not None
        try:
            raw = await self._guarded("list_tools", self._client.step({"type": "list_tools"}))
        except EnvironmentFailure as error:
            if "VALIDATION_ERROR" not in str(error):
                raise
            raise not_a_tool_environment(self.url, str(error)) from error
        tools = (raw.observation or {}).get("tools")
        if not isinstance(tools, list):
            raise not_a_tool_environment(self.url, f"its answer has no tools: {raw.observation!r:.300}")
        return [dict(tool) for tool in tools]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        """Call one of an MCP tool environment's tools: a step (its reward is kept); the observation has
        `tool_name`, `result` (MCP's content, data, is_error) and `error` (a call that did not run)."""
        return await self.step({"type": "call_tool", "tool_name": name, "arguments": arguments})

    async def state(self) -> dict[str, Any]:
        """The environment's state (episode_id, step_count and what the environment adds)."""
        self._check_live()
        assert self._client is not None
        return dict(await self._guarded("state", self._client.state()))

    async def close(self) -> None:
        """End the session (the server drops the instance); once, bounded, also when the server is gone."""
        if self.closed:
            return
        self.closed = True
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client)

    async def __aenter__(self) -> OpenEnvSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _new_client(self) -> GenericEnvClient:
        from openenv.core import GenericEnvClient  # here: openenv (fastapi, gradio types) loads on first use

        return GenericEnvClient(base_url=self.url, connect_timeout_s=self.spec.connect_timeout,
                                message_timeout_s=self.spec.message_timeout)

    async def _call(self, what: str, call: Any) -> StepResult:
        raw = await self._guarded(what, call)
        result = StepResult(observation=dict(raw.observation or {}), reward=raw.reward, done=bool(raw.done),
                            metadata=dict(raw.metadata or {}))
        self.last = result
        return result

    async def _guarded(self, what: str, call: Any) -> Any:
        """Await one client call under a timeout; the server's failures become EnvironmentFailure."""
        # The client's own timeouts cover connecting and receiving; this one also covers a send that stalls.
        limit = self.spec.connect_timeout + self.spec.message_timeout + 5.0
        try:
            return await asyncio.wait_for(_awaited(call), timeout=limit)
        except TimeoutError as error:
            raise EnvironmentFailure(
                f"the OpenEnv server at {self.url} did not answer {what} within "
                f"{self.spec.message_timeout:g}s (openenv message timeout){server_news(self.url)}") from error
        except (ConnectionError, OSError) as error:
            raise EnvironmentFailure(f"the OpenEnv server at {self.url} could not be reached for {what}: "
                                     f"{error}{server_news(self.url)}") from error
        except RuntimeError as error:  # the server's error frame ("Server error: ... (code: ...)")
            if CAPACITY_CODE in str(error):
                raise ServerFull(str(error), capacity_of(error)) from error  # reset waits, then says it all
            raise EnvironmentFailure(f"the OpenEnv server at {self.url} refused {what}: {error}"
                                     f"{server_news(self.url)}") from error
        except Exception as error:
            if type(error).__module__.startswith("websockets"):  # the connection dropped mid-call
                raise EnvironmentFailure(f"the OpenEnv server at {self.url} dropped the session during {what}: "
                                         f"{error}{server_news(self.url)}") from error
            raise

    def _check_not_closed(self) -> None:
        if self.closed:
            raise RuntimeError(f"OpenEnv session for {self.task_id} was closed; the episode is over")

    def _check_live(self) -> None:
        if not self.opened:
            raise RuntimeError(f"OpenEnv session for {self.task_id}: call `await env.reset()` first")
        self._check_not_closed()

    def __getstate__(self) -> dict[str, Any]:
        # Handed to the judge from a workflow process (rollout.workflow_processes > 1), the session is
        # pickled: the judge gets the bookkeeping it reads; the connection stays in the worker, whose
        # cleanups close it.
        return {**self.__dict__, "_client": None}

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open" if self.opened else "new"
        return f"<OpenEnvSession {self.url} {self.task_id} {state} steps={self.steps}>"


def not_a_tool_environment(url: str, why: str) -> UserError:
    return UserError(
        f"The OpenEnv environment at {url} has no MCP tools to list ({why}). agenttune_openenv:ToolEnvWorkflow "
        "needs an MCPEnvironment (openenv.core.env_server.mcp_environment) served with create_app(env, "
        "CallToolAction, CallToolObservation).",
        hint="Use agenttune_openenv:TextEnvWorkflow for a text environment, or a workflow of your own.")


def capacity_of(error: Exception) -> int | None:
    """The server's session limit from its refusal ("Server at capacity: 4/4 sessions active. ...")."""
    found = re.search(r"(\d+)/(\d+) sessions", str(error))
    return int(found.group(2)) if found else None


async def _close_quietly(client: GenericEnvClient) -> None:
    """Close a client, bounded; the server may be gone, and then nothing is left to free."""
    try:
        await asyncio.wait_for(_awaited(client.close()), timeout=CLOSE_TIMEOUT_S)
    except (TimeoutError, Exception) as error:
        log.info("closing an OpenEnv session failed", error=repr(error))


async def _awaited(call: Any) -> Any:
    # The client returns awaitables that are not coroutines (sync or async, decided on first await).
    return await call


def openenv_for(task: Task, tuner: ModelTuner, *, url: str | None = None, reset: dict[str, Any] | None = None,
                message_timeout: float | None = None, capacity_wait: float | None = None) -> OpenEnvSession:
    """The episode's OpenEnv session (the same object on every call within one episode).

    The server's URL comes from the task, `url=`, or the run (the openenv: section); the reset
    arguments from the task (the `openenv` reader sets a seed) and `reset=`. The session is handed
    to the judge as `openenv` and closed when the episode ends.
    """
    existing = tuner.judge_input_dictionary.get(HANDED_KEY)
    if isinstance(existing, OpenEnvSession):
        return existing
    spec = OpenEnvSpec.of(task, url=url, message_timeout=message_timeout, capacity_wait=capacity_wait)
    if reset:
        spec.reset = {**spec.reset, **reset}
    session = OpenEnvSession(spec, task.task_id)
    tuner.update_judge_input_dictionary(**{HANDED_KEY: session})
    tuner.add_cleanup(session.close)
    return session
