"""The `env_service` task reader: the task ids of a split, as the EnvService server lists them.

    task_reader:
      type: env_service
      env_type: appworld
      url: http://127.0.0.1:8080      # default: env_service.url (the launcher's), else this
      train_split: train
      validation_split: dev

Each id becomes a Task with `env_type` set and, in `metadata["env_service"]`, where its environment
lives (url, env_type, timeout, create params): `env_for(task, tuner)` needs nothing else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import Task, TaskReader, UserError
from agenttune_envservice.client import EnvServiceClient, EnvServiceError
from agenttune_envservice.environment import METADATA_KEY, EnvSpec

DEFAULT_URL = "http://127.0.0.1:8080"
URL_VARIABLE = "AGENTTUNE_ENV_SERVICE_URL"  # exported by the launcher for the length of a run

T = TypeVar("T")


class EnvServiceReaderOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env_type: str = Field(description="Environment type the server runs, e.g. appworld.")
    url: str | None = Field(
        default=None, description=f"Base URL of the EnvService server. Default: ${URL_VARIABLE} (set from "
                                  f"env_service.url during a run), else {DEFAULT_URL}.")
    timeout: float = Field(default=120.0, gt=0, description="Seconds one environment request may take.")
    create_params: dict[str, Any] = Field(default_factory=dict, description="`params` sent with every /create.")
    profile_params: dict[str, Any] = Field(default_factory=dict,
                                           description="Extra `params` for /get_env_profile (besides split).")


class EnvServiceTaskReader(TaskReader):
    """Lists a split's tasks from an EnvService server (`/get_env_profile`)."""

    name: ClassVar[str] = "env_service"
    Options: ClassVar[type[BaseModel]] = EnvServiceReaderOptions
    options: EnvServiceReaderOptions

    @property
    def url(self) -> str:
        return (self.options.url or os.environ.get(URL_VARIABLE) or DEFAULT_URL).rstrip("/")

    def read(self, split: str) -> Iterator[Task]:
        url, env_type = self.url, self.options.env_type

        async def profile() -> list[str]:
            async with EnvServiceClient(url, timeout=self.options.timeout) as client:
                return await client.get_env_profile(env_type, split, self.options.profile_params)

        try:
            task_ids = run_blocking(profile)
        except EnvServiceError as error:
            raise UserError(f"Cannot list the {split!r} tasks of environment {env_type!r}: {error}.",
                            hint="Is the EnvService server running at that URL? Set env_service.command to "
                                 "have agenttune start it, or task_reader.url to where it runs.") from error
        if not task_ids:
            raise UserError(f"The EnvService server at {url} lists no tasks for env_type {env_type!r}, split "
                            f"{split!r}.", hint="Check task_reader.env_type and the split names.")
        spec = EnvSpec(url=url, env_type=env_type, timeout=self.options.timeout,
                       create_params=self.options.create_params)
        stored = spec.model_dump()
        return iter([Task(task_id=task_id, env_type=env_type, metadata={METADATA_KEY: stored})
                     for task_id in task_ids])


def run_blocking(function: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine function to the end from sync code, inside a running event loop or not."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(function())
    # Called from async code (a backbone reading tasks): a loop cannot be nested, so use a thread's.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agenttune-envservice") as pool:
        return pool.submit(lambda: asyncio.run(function())).result()
