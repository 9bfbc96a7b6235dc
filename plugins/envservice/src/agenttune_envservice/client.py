"""An async client for the EnvService protocol.

Every endpoint is a POST of `{"env_type", "task_id", "instance_id", "messages", "params"}` answered
with `{"success": true, "data": ...}`; `GET /healthz` answers 200 when the server is up.

| method            | endpoint          | returns                                                  |
| ----------------- | ----------------- | -------------------------------------------------------- |
| get_env_profile   | /get_env_profile  | the task ids of a split                                  |
| create            | /create           | `Created(state=[messages], info={instance_id, task_id})` |
| step              | /step             | `Stepped(state, reward, is_terminated, info)`            |
| evaluate          | /evaluate         | the score (float)                                        |
| get_info          | /get_info         | whatever the environment returns                         |
| release           | /release          | whether the server knew the instance                     |
| healthz           | GET /healthz      | None, or EnvServiceUnavailable                           |

Failures raise `EnvServiceError` with the endpoint, the instance and what went wrong; nothing is
papered over with a made-up state or a 0.0 score (the reference client does that, and trains on it).
Connection errors and 5xx answers are retried with backoff (see agenttune.web.http_retry); a `step`
is retried only when the server certainly did not act on it.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
from pydantic import BaseModel, Field, ValidationError

from agenttune.plugin_api import RetryPolicy, get_logger, send_with_retries

log = get_logger("envservice.client")


class EnvServiceError(RuntimeError):
    """An EnvService call failed; the message says which call, on which instance, and why."""


class EnvServiceUnavailable(EnvServiceError):
    """The server could not be reached, or kept answering 5xx, after every retry."""


class EnvServiceProtocolError(EnvServiceError):
    """The server answered, but not as the protocol says (or said `success: false`)."""


# Servers that agenttune launched (see launcher.py), and those it then saw exit: base URL -> what
# happened. Every "unreachable" error about such a server says so, which beats a bare "connection
# refused" by a long way, and calls to it fail at once instead of retrying into the void.
_launched_servers: set[str] = set()
_exited_servers: dict[str, str] = {}
# How long a broken connection to a launched server waits for the launcher's watchdog to see it exit.
EXIT_GRACE_S = 1.0


def note_server_launched(base_url: str) -> None:
    _launched_servers.add(base_url.rstrip("/"))
    _exited_servers.pop(base_url.rstrip("/"), None)


def note_server_exit(base_url: str, what: str) -> None:
    """Record that the server at `base_url` is gone (called by the launcher's watchdog)."""
    _exited_servers[base_url.rstrip("/")] = what


def note_server_stopped(base_url: str) -> None:
    _launched_servers.discard(base_url.rstrip("/"))
    _exited_servers.pop(base_url.rstrip("/"), None)


class _ServerGone(Exception):
    """Raised inside a send: the server is known to have exited."""


class Created(BaseModel):
    state: list[dict[str, Any]] = Field(description="The initial messages (usually system + user).")
    info: dict[str, Any] = Field(default_factory=dict)
    reward: float = 0.0
    is_terminated: bool = False


class Stepped(BaseModel):
    state: list[dict[str, Any]] = Field(description="What the environment says back, as messages.")
    reward: float = 0.0
    is_terminated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class EnvServiceClient:
    """One connection pool to one EnvService server. Use `async with`, or call `aclose()`."""

    def __init__(self, base_url: str, *, timeout: float = 120.0, retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy(attempts=4, backoff=0.5, max_backoff=8.0)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport)

    async def __aenter__(self) -> EnvServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the protocol ------------------------------------------------------------------------------
    async def healthz(self) -> None:
        """Return when the server answers `GET /healthz` with 200; EnvServiceUnavailable otherwise."""
        response = await self._send("GET", "/healthz", None, where="healthz", idempotent=True)
        if response.status_code != 200:
            raise EnvServiceUnavailable(f"EnvService at {self.base_url}: /healthz answered HTTP "
                                        f"{response.status_code}: {_excerpt(response.text)}")

    async def get_env_profile(self, env_type: str, split: str = "train", params: dict[str, Any] | None = None) -> list[str]:
        data = await self._call("/get_env_profile", env_type=env_type, params={"split": split, **(params or {})})
        if not isinstance(data, list):
            raise self._malformed("/get_env_profile", data, "a list of task ids")
        return [str(task_id) for task_id in data]

    async def create(self, env_type: str, task_id: str, instance_id: str,
                     params: dict[str, Any] | None = None) -> Created:
        """Create an instance under the id we chose, so a retried create cannot leak a second one."""
        data = await self._call("/create", env_type=env_type, task_id=task_id, instance_id=instance_id,
                                params=params)
        return self._parse(Created, data, "/create", instance_id)

    async def step(self, instance_id: str, action: dict[str, Any], params: dict[str, Any] | None = None) -> Stepped:
        data = await self._call("/step", instance_id=instance_id, messages=action, params=params, idempotent=False)
        if isinstance(data, dict) and isinstance(data.get("state"), dict):  # some servers send one message
            data = {**data, "state": [data["state"]]}
        stepped = self._parse(Stepped, data, "/step", instance_id)
        if not math.isfinite(stepped.reward):
            raise self._malformed("/step", data, "a finite reward", instance_id)
        return stepped

    async def evaluate(self, instance_id: str, messages: dict[str, Any] | None = None,
                       params: dict[str, Any] | None = None) -> float:
        data = await self._call("/evaluate", instance_id=instance_id, messages=messages, params=params)
        if isinstance(data, bool) or not isinstance(data, int | float) or not math.isfinite(data):
            raise self._malformed("/evaluate", data, "a finite number", instance_id)
        return float(data)

    async def get_info(self, instance_id: str, messages: dict[str, Any] | None = None,
                       params: dict[str, Any] | None = None) -> Any:
        return await self._call("/get_info", instance_id=instance_id, messages=messages, params=params)

    async def release(self, instance_id: str, *, timeout: float | None = None,
                      retry: RetryPolicy | None = None) -> bool:
        """Release an instance; False when the server did not know it (already released, or restarted).

        Cleanup code passes a short `timeout` and `retry` so that a dead server cannot hold it up.
        """
        body = self._body(instance_id=instance_id)
        reply = await self._reply("/release", body, instance_id, idempotent=True, timeout=timeout, retry=retry)
        return bool(reply.get("success"))

    # -- plumbing --------------------------------------------------------------------------------------
    async def _call(self, path: str, *, env_type: str | None = None, task_id: str | None = None,
                    instance_id: str | None = None, messages: Any = None, params: dict[str, Any] | None = None,
                    idempotent: bool = True) -> Any:
        body = self._body(env_type=env_type, task_id=task_id, instance_id=instance_id, messages=messages,
                          params=params)
        reply = await self._reply(path, body, instance_id, idempotent=idempotent)
        if reply.get("success") is not True:
            raise EnvServiceProtocolError(f"EnvService {path}{_on(instance_id)} at {self.base_url} reported "
                                          f"failure: {_excerpt(repr(reply))}")
        return reply.get("data")

    @staticmethod
    def _body(*, env_type: str | None = None, task_id: str | None = None, instance_id: str | None = None,
              messages: Any = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"env_type": env_type, "task_id": task_id, "instance_id": instance_id,
                "messages": messages or {}, "params": params or {}}

    async def _reply(self, path: str, body: dict[str, Any], instance_id: str | None, *, idempotent: bool,
                     timeout: float | None = None, retry: RetryPolicy | None = None) -> dict[str, Any]:
        where = f"{path}{_on(instance_id)}"
        response = await self._send("POST", path, body, where=where, idempotent=idempotent, timeout=timeout,
                                    retry=retry)
        if response.status_code >= 500:
            raise EnvServiceUnavailable(f"EnvService {where} at {self.base_url} failed with HTTP "
                                        f"{response.status_code}: {_excerpt(response.text)}{self._exit_notice()}")
        if response.status_code != 200:
            raise EnvServiceProtocolError(f"EnvService {where} at {self.base_url} refused the request with HTTP "
                                          f"{response.status_code}: {_excerpt(response.text)}")
        try:
            reply = response.json()
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise EnvServiceProtocolError(f"EnvService {where} at {self.base_url} answered with something that "
                                          f"is not a JSON object: {_excerpt(response.text)}")
        return reply

    async def _send(self, method: str, path: str, body: dict[str, Any] | None, *, where: str, idempotent: bool,
                    timeout: float | None = None, retry: RetryPolicy | None = None) -> httpx.Response:
        def note(attempt: int, why: str) -> None:
            log.warning("envservice call failed; retrying", call=where, attempt=attempt, error=why)

        def send() -> Any:
            if self.server_exited:  # no point knocking (or retrying): every episode after the crash fails at once
                raise _ServerGone()
            extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
            return self._http.request(method, path, json=body, **extra)

        try:
            response, _ = await send_with_retries(send, retry or self.retry, idempotent=idempotent, on_retry=note)
        except _ServerGone:
            raise EnvServiceUnavailable(f"EnvService {where} at {self.base_url} was not sent{self._exit_notice()}") from None
        except httpx.TransportError as error:
            notice = await self._exit_notice_after_break()
            raise EnvServiceUnavailable(f"EnvService {where} at {self.base_url} failed: {type(error).__name__}: "
                                        f"{error or 'no answer'}{notice}") from error
        return response

    async def _exit_notice_after_break(self) -> str:
        """The exit notice of a launched server whose connection just broke (it may be dying right now)."""
        if self.base_url in _launched_servers:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + EXIT_GRACE_S
            while not self.server_exited and loop.time() < deadline:
                await asyncio.sleep(0.05)
        return self._exit_notice()

    @property
    def server_exited(self) -> bool:
        """Whether agenttune launched this server and saw it exit."""
        return self.base_url in _exited_servers

    def _exit_notice(self) -> str:
        what = _exited_servers.get(self.base_url)
        return f" ({what})" if what else ""

    def _parse(self, model: type[BaseModel], data: Any, path: str, instance_id: str | None) -> Any:
        try:
            return model.model_validate(data)
        except ValidationError as error:
            raise self._malformed(path, data, f"an object with {', '.join(model.model_fields)}",
                                  instance_id) from error

    def _malformed(self, path: str, data: Any, expected: str, instance_id: str | None = None) -> EnvServiceProtocolError:
        return EnvServiceProtocolError(f"EnvService {path}{_on(instance_id)} at {self.base_url} returned "
                                       f"{_excerpt(repr(data))}; expected {expected}")


def _on(instance_id: str | None) -> str:
    return f" (instance {instance_id})" if instance_id else ""


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
