"""The environment of one episode, gym-style: `reset()` then `step(action)` until terminated.

In a workflow:

    from agenttune_envservice import env_for

    async def execute(self, task, tuner):
        env = env_for(task, tuner)
        messages = await env.reset()                         # the instance is created here
        while True:
            reply = ...                                      # the agent answers
            observation, reward, terminated, info = await env.step(reply)
            if terminated or tuner.context_overflow:
                break
        return WorkflowOutput()                              # the env_service judge evaluates it

`env_for` registers the environment with the episode: the `env_service` judge finds it (as the
judge input `env`, ASTune's `judge_input_dictionary['env']`) and evaluates it, and the instance is
released once the episode is over — after the judge, and also when the workflow raised, timed out
or was cancelled. Nothing is left running on the server.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from agenttune.plugin_api import RetryPolicy, UserError, get_logger
from agenttune_envservice.client import EnvServiceClient, EnvServiceError

if TYPE_CHECKING:
    from agenttune.plugin_api import ModelTuner, Task

log = get_logger("envservice.environment")

METADATA_KEY = "env_service"
# Releasing is cleanup: it must finish quickly even when the server is slow or gone.
RELEASE_TIMEOUT_S = 10.0
# A leaked instance holds server resources for good, so release tries harder than a step; a server
# known to have exited is not asked at all (see release()).
RELEASE_RETRY = RetryPolicy(attempts=5, backoff=0.2)


class EnvSpec(BaseModel):
    """Where a task's environment lives; the `env_service` reader stores it in `task.metadata`."""

    url: str = Field(description="Base URL of the EnvService server.")
    env_type: str = Field(description="Environment type, e.g. appworld.")
    timeout: float = Field(default=120.0, gt=0, description="Seconds one request may take.")
    create_params: dict[str, Any] = Field(default_factory=dict, description="`params` sent with /create.")

    @classmethod
    def of(cls, task: Task, **overrides: Any) -> EnvSpec:
        stored = task.metadata.get(METADATA_KEY) or {}
        given = {key: value for key, value in overrides.items() if value is not None}
        values = {"env_type": task.env_type, **stored, **given}
        missing = [key for key in ("url", "env_type") if not values.get(key)]
        if missing:
            raise UserError(
                f"Task {task.task_id!r} does not say which EnvService environment it belongs to "
                f"(no {' or '.join(missing)} in task.metadata[{METADATA_KEY!r}]).",
                hint="Read tasks with task_reader.type: env_service, or pass url= and env_type= to env_for().")
        return cls.model_validate(values)


class Environment:
    """One EnvService instance for one episode. Created by `reset()`, released by `release()`."""

    def __init__(self, spec: EnvSpec, task_id: str, *, instance_id: str | None = None):
        self.spec = spec
        self.task_id = task_id
        self.instance_id = instance_id or f"agenttune-{task_id}-{secrets.token_hex(6)}"
        self.messages: list[dict[str, Any]] = []  # what reset() returned
        self.steps = 0
        self.terminated = False
        self.created = False
        self.released = False
        self._client: EnvServiceClient | None = None

    @property
    def client(self) -> EnvServiceClient:
        # Created on first use, inside the episode's event loop (an httpx client belongs to one loop).
        if self._client is None:
            self._client = EnvServiceClient(self.spec.url, timeout=self.spec.timeout)
        return self._client

    async def reset(self) -> list[dict[str, Any]]:
        """Create the instance; returns its initial messages (typically a system and a user message)."""
        if self.created:
            raise RuntimeError(f"environment {self.instance_id} was already reset: one instance per episode")
        if self.released:
            raise RuntimeError(f"environment {self.instance_id} was released; the episode is over")
        self.created = True  # before the call: a create that fails half-way must still be released
        created = await self.client.create(self.spec.env_type, self.task_id, self.instance_id,
                                           params=self.spec.create_params)
        self.messages = created.state
        self.terminated = created.is_terminated
        return list(created.state)

    async def step(self, action: str | dict[str, Any], params: dict[str, Any] | None = None
                   ) -> tuple[str, float, bool, dict[str, Any]]:
        """Send the agent's action; returns (observation text, reward, terminated, info).

        `action` is the assistant's text or a message dict. `info` holds the server's info plus
        `state`, the observation as the list of messages the server sent.
        """
        self._check_live()
        message = {"role": "assistant", "content": action} if isinstance(action, str) else dict(action)
        stepped = await self.client.step(self.instance_id, message, params=params)
        self.steps += 1
        self.terminated = stepped.is_terminated
        observation = "\n\n".join(_text(item.get("content")) for item in stepped.state)
        return observation, stepped.reward, stepped.is_terminated, {**stepped.info, "state": stepped.state}

    gym_step = step  # ASTune's name

    async def evaluate(self, *, sparse: bool = True, params: dict[str, Any] | None = None) -> float:
        """The environment's score for this instance (`params.sparse` selects sparse or dense)."""
        self._check_live()
        return await self.client.evaluate(self.instance_id, params={"sparse": sparse, **(params or {})})

    async def get_info(self, messages: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
        self._check_live()
        return await self.client.get_info(self.instance_id, messages=messages, params=params)

    async def release(self) -> None:
        """Release the instance (once; a no-op when it was never created) and close the connection."""
        if self.released:
            return
        self.released = True
        try:
            if self.created and self.client.server_exited:
                log.info("not releasing: the server exited, and its instances with it", instance=self.instance_id)
            elif self.created:
                known = await self.client.release(self.instance_id, timeout=RELEASE_TIMEOUT_S, retry=RELEASE_RETRY)
                if not known:
                    log.warning("the server did not know the instance it released", instance=self.instance_id)
        finally:
            if self._client is not None:
                await self._client.aclose()

    async def __aenter__(self) -> Environment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def _check_live(self) -> None:
        if not self.created:
            raise RuntimeError(f"environment {self.instance_id}: call `await env.reset()` first")
        if self.released:
            raise RuntimeError(f"environment {self.instance_id} was released; the episode is over")

    def __repr__(self) -> str:
        state = "released" if self.released else "live" if self.created else "new"
        return f"<Environment {self.spec.env_type}/{self.task_id} {self.instance_id} {state}>"


def env_for(task: Task, tuner: ModelTuner, *, url: str | None = None, env_type: str | None = None,
            create_params: dict[str, Any] | None = None, timeout: float | None = None) -> Environment:
    """The episode's environment (the same object on every call within one episode).

    Where it lives comes from the task (the `env_service` reader stores it), or from the keyword
    arguments. The environment is handed to the judge as `env` and released when the episode ends.
    """
    existing = tuner.judge_input_dictionary.get("env")
    if isinstance(existing, Environment):
        return existing
    if not hasattr(tuner, "add_cleanup"):
        raise UserError("This agenttune core cannot release environments after the judge (ModelTuner has no "
                        "add_cleanup).", hint="Upgrade agenttune to the version this plugin came with.")
    spec = EnvSpec.of(task, url=url, env_type=env_type, create_params=create_params, timeout=timeout)
    environment = Environment(spec, task.task_id)
    tuner.update_judge_input_dictionary(env=environment)
    tuner.add_cleanup(environment.release)
    return environment


def _text(content: Any) -> str:
    if isinstance(content, list):  # multi-part content: the text parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


__all__ = ["EnvSpec", "Environment", "EnvServiceError", "env_for"]
