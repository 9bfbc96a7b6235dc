"""A broken environment is one paragraph or a named episode status, never a crash or a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import config_data, rollout_records, write_config

from agenttune.plugin_api import UserError, load_config, train_from_config


def test_an_environment_that_is_not_installed_is_one_paragraph(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, config_data("vf-not-installed", replies=["x"])), backbone="debug")
    with pytest.raises(UserError) as caught:
        train_from_config(config, run_dir=tmp_path / "run")
    text = str(caught.value)
    assert "'vf-not-installed' cannot be imported" in text and "prime env install" in caught.value.hint


def test_an_environment_whose_import_fails_names_the_missing_module(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, config_data("vf-broken-import", replies=["x"])), backbone="debug")
    with pytest.raises(UserError) as caught:
        train_from_config(config, run_dir=tmp_path / "run")
    assert "a_package_nobody_installed" in str(caught.value)


def test_rewards_that_raise_or_hang_end_their_episode_under_the_judges_limits(tmp_path: Path) -> None:
    # a judge worker process: the hanging reward function's process is killed at judge.timeout
    data = config_data("vf-bad-rewards", replies=["hello"], judge={"isolation": "process", "workers": 1, "timeout": 45},
                       rollout={"num_repeat": 1}, debug={"first_n_tasks": 3, "max_parallel": 3})
    run = train_from_config(load_config(write_config(tmp_path, data), backbone="debug"), run_dir=tmp_path / "run")
    status = {r["task"]["task_id"]: (r["status"], r["error"]) for r in rollout_records(run.run_dir)}
    assert status["ok"] == ("ok", None)
    assert status["raise"][0] == "judge_error" and "this reward function is broken" in status["raise"][1]
    assert status["hang"][0] == "judge_timeout"


def test_a_rollout_the_environment_fails_is_an_environment_error_named_by_its_verifiers_kind(tmp_path: Path) -> None:
    data = config_data("vf-bad-rewards", replies=["hello"], rollout={"num_repeat": 1},
                       task_reader={"args": {"modes": ["setup"]}}, debug={"first_n_tasks": 1})
    run = train_from_config(load_config(write_config(tmp_path, data), backbone="debug"), run_dir=tmp_path / "run")
    [record] = rollout_records(run.run_dir)
    assert record["status"] == "environment_error"  # the task's own setup raised: not the model's doing
    assert "task_error" in record["error"] and "the task's setup is broken" in record["error"]


def test_verifiers_error_kinds_map_to_the_environment_or_the_workflow() -> None:
    from agenttune_verifiers.workflow import ENVIRONMENT_KINDS, VerifiersRolloutError, rollout_failure
    from verifiers.v1.trace import Error

    from agenttune.plugin_api import EnvironmentFailure

    for kind in ENVIRONMENT_KINDS:  # the task's hooks, tool servers, Env.run, box, interception, harness
        failure = rollout_failure([Error(type=kind, message="it broke")], False, [])
        assert isinstance(failure, EnvironmentFailure), kind
    server_died = rollout_failure([Error(type="ToolsetError", message="tool server exited\n(code 1)")], False, [])
    assert str(server_died) == "toolset_error: tool server exited (code 1)"
    model = rollout_failure([Error(type="ProviderError", message="502 from the endpoint")], False, [])
    assert isinstance(model, VerifiersRolloutError) and str(model) == "provider_error: 502 from the endpoint"
    assert isinstance(rollout_failure([Error(type="HarnessError", message="slow")], True, []), VerifiersRolloutError)
    assert isinstance(rollout_failure([], False, ["error"]), VerifiersRolloutError)


def test_verifiers_own_rollout_timeout_ends_the_trace_as_verifiers_does(tmp_path: Path) -> None:
    # verifiers scores a timed-out agent's partial trajectory (ok, stop condition agent_timeout): so does agenttune
    data = config_data("vf-say-word", replies=["apple"], rollout={"num_repeat": 1},
                       task_reader={"rollout_timeout": 0.5}, engine={"delay": 5.0}, debug={"first_n_tasks": 1})
    run = train_from_config(load_config(write_config(tmp_path, data), backbone="debug"), run_dir=tmp_path / "run")
    [record] = rollout_records(run.run_dir)
    assert record["status"] == "ok" and record["reward"] == 0.0
    summary = record["output"]["verifiers"][0]
    assert summary["stop_condition"] == "agent_timeout" and summary["is_timeout"]
