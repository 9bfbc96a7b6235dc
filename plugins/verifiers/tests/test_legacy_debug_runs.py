"""verifiers 0.1-0.3 environments (`load_environment(**kw)`) with `--backbone debug`, on real verifiers 0.3.1.

Single-turn, tool and custom multi-turn environments written in tests/envs03; the model is agenttune's
scripted engine behind the gateway, so rewards and recorded tokens are known exactly.
"""

from __future__ import annotations

from pathlib import Path

from conftest import config_data, loss_runs, rollout_records, write_config

from agenttune.plugin_api import load_config, train_from_config


def debug_run(tmp_path: Path, data: dict) -> list[dict]:
    config = load_config(write_config(tmp_path, data), backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    return rollout_records(run.run_dir)


def test_a_single_turn_environment_scores_with_its_weighted_rubric(tmp_path: Path) -> None:
    # a judge worker process (agenttune's default): the rollout's state reaches the rubric as a pickled copy
    data = config_data("vf03-say-word", replies=["apple", "wrong"], task_reader={"args": {"with_group_reward": True}},
                       judge={"isolation": "process", "workers": 1, "timeout": 60})
    records = debug_run(tmp_path, data)
    assert len(records) == 4  # 2 tasks x 2 repeats
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    # replies alternate "apple"/"wrong"; task train-0's word is apple. Each episode is its own group of one
    # for the group-level function (unique_in_group: 1.0, weight 0.5): 1.0 + 0.5 right, 0.0 + 0.5 wrong
    assert sorted(r["reward"] for r in records) == [0.5, 0.5, 0.5, 1.5]
    best = max(records, key=lambda r: r["reward"])
    assert best["task"]["task_id"] == "train-0"
    assert best["judge_details"] == {"reward/exact": 1.0, "metric/reply_chars": 5.0, "reward/unique_in_group": 1.0,
                                     "metric/num_turns": 1.0}
    assert best["output"]["verifiers"][0]["stop_condition"] == "max_turns_reached"


TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_a_tool_environment_trains_on_exactly_the_tokens_sampled_in_every_sample(tmp_path: Path) -> None:
    from agenttune.testing import tiny_tokenizer

    data = config_data("vf03-add-tool", replies=[TOOL_CALL, "5"], debug={"first_n_tasks": 1, "max_parallel": 1})
    records = debug_run(tmp_path, data)
    assert len(records) == 2
    tokenizer = tiny_tokenizer()
    sampled = [tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
               for reply in (TOOL_CALL, "5")]
    for record in records:
        assert record["status"] == "ok", record["error"]
        assert record["reward"] == 1.0  # right answer (0.5) and the tool was used (0.5)
        assert record["judge_details"]["reward/correct"] == 1.0
        assert record["judge_details"]["metric/add_calls"] == 1.0  # ToolEnv's own tool-call metric
        assert len(record["samples"]) == 1  # the two calls merged: the tool result is context (mask 0)
        sample = record["samples"][0]
        assert sample["num_calls"] == 2
        assert loss_runs(sample) == sampled  # 100 % of the samples: the tokens trained are the tokens sampled
        assert sum(sample["loss_mask"]) == sum(len(ids) for ids in sampled)
        summary = record["output"]["verifiers"][0]
        assert summary["tool_calls"] == [{"name": "add", "arguments": '{"a": 2, "b": 3}'}]
        assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_a_custom_multi_turn_environment_plays_the_user_and_keeps_its_state(tmp_path: Path) -> None:
    data = config_data("vf03-guess-game", replies=["1", "4"], debug={"first_n_tasks": 1, "max_parallel": 1})
    records = debug_run(tmp_path, data)
    for record in records:  # task train-0's digit is 4: "1", then "higher", then "4"
        assert record["status"] == "ok", record["error"]
        assert record["reward"] == 1.0
        assert record["judge_details"]["metric/guesses"] == 2.0
        assert [m["content"] for m in record["messages"]] == ["Guess my digit (0-9).", "1", "higher", "4"]
        assert len(record["samples"]) == 1 and record["samples"][0]["num_calls"] == 2
        summary = record["output"]["verifiers"][0]
        assert summary["stop_condition"] == "guessed_right" and summary["state"] == {"guesses": 1}


def test_an_environment_that_fails_its_episode_is_an_environment_error(tmp_path: Path) -> None:
    data = config_data("vf03-guess-game", replies=["1"], task_reader={"args": {"broken": True}},
                       rollout={"num_repeat": 1}, debug={"first_n_tasks": 1})
    [record] = debug_run(tmp_path, data)
    assert record["status"] == "environment_error"
    assert "runtime_error: the game server is down" in record["error"]  # the kind, then its message


def test_verifiers_03_errors_map_to_the_environment_or_the_workflow() -> None:
    from agenttune_verifiers.legacy.rollout import LegacyRolloutError, classify
    from verifiers.legacy.errors import InfraError, ModelError, SandboxError, ToolCallError, ToolParseError

    from agenttune.plugin_api import EnvironmentFailure

    for error in (InfraError("sandbox gone"), SandboxError("no box"), ToolCallError("the tool raised")):
        assert isinstance(classify(error), EnvironmentFailure), error
    for error in (ModelError("endpoint refused"), ToolParseError("bad arguments")):  # the model's output or endpoint
        assert isinstance(classify(error), LegacyRolloutError), error
    assert str(classify(InfraError("sandbox gone"))) == "infra_error: sandbox gone"
