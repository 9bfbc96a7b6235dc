"""The `env_service` task reader against the test server."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import EnvServer

from agenttune.plugin_api import TaskReaderConfig, UserError, component_options, get_component


def reader(**options: object):
    cls = get_component("task_readers", "env_service")
    return cls(component_options(cls, TaskReaderConfig(type="env_service", **options), "task_reader"))


def test_tasks_carry_where_their_environment_lives(env_server: EnvServer) -> None:
    tasks = list(reader(env_type="guess", url=env_server.url, timeout=7, create_params={"level": 2}).read("val"))
    assert [task.task_id for task in tasks] == [f"val-{n}" for n in range(8)]
    assert all(task.env_type == "guess" for task in tasks)
    assert tasks[0].metadata["env_service"] == {"url": env_server.url, "env_type": "guess", "timeout": 7.0,
                                                "create_params": {"level": 2}}


def test_the_url_defaults_to_the_run_s_env_service_url(env_server: EnvServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTTUNE_ENV_SERVICE_URL", env_server.url)
    assert len(list(reader(env_type="guess").read("train"))) == 8


def test_problems_are_user_errors(start_env_server: Callable[..., EnvServer]) -> None:
    empty = start_env_server("--tasks", "0")
    with pytest.raises(UserError, match="lists no tasks for env_type 'guess', split 'train'"):
        list(reader(env_type="guess", url=empty.url).read("train"))
    with pytest.raises(UserError, match="unknown split 'dev'"):
        list(reader(env_type="guess", url=empty.url).read("dev"))
    with pytest.raises(UserError, match="env_type"):
        component_options(get_component("task_readers", "env_service"), TaskReaderConfig(type="env_service"),
                          "task_reader")
