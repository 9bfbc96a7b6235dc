"""The three kinds of verifiers environment (single-turn, tool, custom multi-turn) with `--backbone debug`.

The real verifiers package runs its own rollout; the model is agenttune's scripted engine behind the
gateway, so the rewards and the recorded tokens are known exactly.
"""

from __future__ import annotations

from pathlib import Path

from conftest import config_data, loss_runs, rollout_records, write_config

from agenttune.plugin_api import load_config, train_from_config


def debug_run(tmp_path: Path, data: dict) -> list[dict]:
    config = load_config(write_config(tmp_path, data), backbone="debug")
    run = train_from_config(config, run_dir=tmp_path / "run")
    return rollout_records(run.run_dir)


def test_a_single_turn_environment_is_read_rolled_out_and_scored_by_its_own_reward(tmp_path: Path) -> None:
    records = debug_run(tmp_path, config_data("vf-say-word", replies=["apple", "wrong"]))
    assert len(records) == 4  # 2 tasks x 2 repeats
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    by_task: dict[str, list[float]] = {}
    for record in records:
        by_task.setdefault(record["task"]["task_id"], []).append(record["reward"])
    # the scripted engine answers "apple" then "wrong" in turn: task say-0's answer is apple
    assert sorted(r["reward"] for r in records) == [0.0, 0.0, 0.0, 1.0]
    apple = next(r for r in records if r["reward"] == 1.0)
    assert apple["task"]["task_id"] == "say-0"
    assert apple["judge_details"]["reward/exact"] == 1.0
    assert apple["judge_details"]["metric/reply_chars"] == 5.0
    summary = apple["output"]["verifiers"][0]
    assert summary["ok"] and summary["stop_condition"] == "agent_completed"


TOOL_CALL = '<tool_call>\n{"name": "add_tools_add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def test_a_tool_environment_trains_on_exactly_the_tokens_sampled_in_every_sample(tmp_path: Path) -> None:
    from agenttune.testing import tiny_tokenizer

    data = config_data("vf-add-tool", replies=[TOOL_CALL, "5"], debug={"first_n_tasks": 1, "max_parallel": 1})
    records = debug_run(tmp_path, data)
    assert len(records) == 2
    tokenizer = tiny_tokenizer()
    sampled = [tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
               for reply in (TOOL_CALL, "5")]
    for record in records:
        assert record["status"] == "ok", record["error"]
        assert record["reward"] == 1.0  # right answer (0.5) and the tool was used (0.5)
        assert record["judge_details"] == {"reward/correct": 1.0, "reward/used_tool": 1.0}
        # the two calls merged into one sample: the tool result is context (mask 0), each reply as sampled
        assert len(record["samples"]) == 1
        sample = record["samples"][0]
        assert sample["num_calls"] == 2
        assert loss_runs(sample) == sampled  # 100 % of the samples: the tokens trained are the tokens sampled
        assert sum(sample["loss_mask"]) == sum(len(ids) for ids in sampled)
        summary = record["output"]["verifiers"][0]
        assert summary["tool_calls"] == [{"name": "add_tools_add", "arguments": '{"a": 2, "b": 3}'}]
        assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_a_custom_multi_turn_environment_plays_the_user_between_turns(tmp_path: Path) -> None:
    data = config_data("vf-guess-game", replies=["1", "4"], debug={"first_n_tasks": 1, "max_parallel": 1})
    records = debug_run(tmp_path, data)
    for record in records:  # task guess-0's digit is 4: "1", then "higher", then "4"
        assert record["status"] == "ok", record["error"]
        assert record["reward"] == 1.0
        assert record["judge_details"]["metric/guesses"] == 2.0
        contents = [m["content"] for m in record["messages"]]
        assert contents == ["Guess my digit (0-9).", "1", "higher", "4"]
        assert len(record["samples"]) == 1 and record["samples"][0]["num_calls"] == 2
