"""AgentTrainer (AWorld Train's entry point) on agenttune: real AWorld agents with the example's MCP
server over stdio, episodes judged by an AWorld-signature reward function or an agenttune judge,
failures isolated; and the example trained with the local backbone on CPU, from Python and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gaia_agent
import pytest
from agenttune_aworld import AgentTrainer
from conftest import EXAMPLE, ROOT, ToolUsingEngine, tool_call
from gaia_reward import gaia_reward_func

from agenttune import Judge, JudgeResult
from agenttune.plugin_api import UserError, read_records, scripted_logprob

TASKS = [
    {"task_id": "right", "question": "What is calc: 6 * 7?", "answer": "42"},
    {"task_id": "wrong", "question": "What is calc: 2 + 2?", "answer": "5"},
    {"task_id": "hangs", "question": "HANG until stopped", "answer": "x"},
    {"task_id": "fails", "question": "FAIL please", "answer": "x"},
]


def debug_config(**changes):
    config = {
        "model": {"path": "tiny://default", "max_model_len": 4096},
        "engine": {"type": "tool_using"},
        "task_reader": {"query_column": "question", "ground_truth_column": "answer"},
        "rollout": {"num_repeat": 1, "episode_timeout": 40, "max_response_length_in_one_turn": 128},
        "debug": {"first_n_tasks": 10, "max_parallel": 4},
    }
    config.update(changes)
    return config


@pytest.fixture
def tool_using_engine(register_plugin):
    register_plugin(engines=[ToolUsingEngine])
    ToolUsingEngine.generations.clear()


def records(run):
    return {record.task.task_id: record for record in read_records(run.run_dir / "rollouts" / "step_000001_train.jsonl")}


def trained_runs(sample):
    """The runs of mask-1 tokens in a sample's response: what the model generated, call by call."""
    runs, current = [], []
    for token, mask in zip(sample.response_ids, sample.loss_mask, strict=True):
        if mask:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_an_aworld_signature_reward_judges_real_tool_use_and_failures_stay_in_their_episode(
        tool_using_engine, tiny_tokenizer, tmp_path):
    template = gaia_agent.build_agent()  # an Agent, as AWorld Train takes it: rebuilt for every episode
    run = AgentTrainer(agent=template, config=debug_config(), reward_func=gaia_reward_func, train_dataset=TASKS,
                       run_path=tmp_path / "run", train_engine_name="debug").train()
    got = records(run)
    assert {task: (r.status, r.reward) for task, r in got.items()} == {
        "right": ("ok", 1.0), "wrong": ("ok", 0.0), "hangs": ("timeout", 0.0), "fails": ("engine_error", 0.0)}
    assert "episode_timeout=40" in got["hangs"].error and "AWorld task failed" in got["fails"].error
    right = got["right"]
    assert right.output["final_answer"] == "<answer>42</answer>"
    assert [m["content"] for m in right.messages if m["role"] == "tool"] == ["42"]  # from the MCP server
    [sample] = right.samples  # the tool call and the answer, merged: exactly the sampled tokens are trained
    replies = [tool_call("calculate", expression="6 * 7"), "<answer>42</answer>"]
    expected = [tiny_tokenizer.encode(reply, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
                for reply in replies]
    assert trained_runs(sample) == expected and all(ids in ToolUsingEngine.generations for ids in expected)
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m] == [
        scripted_logprob(token) for ids in expected for token in ids]
    aworld_logs = run.run_dir / "aworld_logs"
    assert (aworld_logs / "llm.log").stat().st_size > 0 and (aworld_logs / "trajectory.log").stat().st_size > 0


class FortyTwoJudge(Judge):
    def judge(self, judge_input):
        hit = "42" in str(judge_input.final_answer)
        return JudgeResult(reward=2.0 if hit else -1.0, success=hit, details={"checked": 1})


def test_an_agenttune_judge_works_as_reward_func(tool_using_engine, tmp_path):
    run = AgentTrainer(agent=gaia_agent.build_agent, config=debug_config(), reward_func=FortyTwoJudge,
                       train_dataset=TASKS[:2], run_path=tmp_path / "run", train_engine_name="debug").train()
    got = records(run)
    assert {task: (r.reward, r.success, r.judge_details) for task, r in got.items()} == {
        "right": (2.0, True, {"checked": 1}), "wrong": (-1.0, False, {"checked": 1})}
    assert run.config.judge.judge_protocol == "test_training:FortyTwoJudge"


@pytest.mark.parametrize(("arguments", "message"), [
    ({"agent": None}, "AgentTrainer needs an agent"),
    ({"reward_func": None}, "AgentTrainer has no reward"),
    ({"reward_func": lambda answer: 1.0}, r"cannot be called as \(data_source, solution_str, ground_truth, extra_info\)"),
    ({"reward_func": 3}, "reward_func is a int"),
    ({"agent": "missing.yaml"}, "the file does not exist"),
    ({"agent": "gaia_agent:build_agnet"}, r"agent: module 'gaia_agent' has no attribute 'build_agnet'"),
])
def test_bad_arguments_are_clear_errors(arguments, message):
    base = {"agent": gaia_agent.build_agent, "config": debug_config(), "reward_func": gaia_reward_func,
            "train_dataset": TASKS, "train_engine_name": "debug"}
    with pytest.raises(UserError, match=message):
        AgentTrainer(**{**base, **arguments})


def run_smoke(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE), "COLUMNS": "200"}
    env.pop("AWORLD_LOG_PATH", None)  # as a user runs it: AWorld would write ./logs
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def assert_trained(run_dir: Path) -> None:
    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # The tiny model is random: rewards are 0, so GRPO has nothing to learn from (no zero-variance group
    # is trained); the step, validation and checkpoint still run on the example's episodes.
    assert step["step"] == 1 and step["episodes"] == 4 and step["failure_rate"] == 0.0
    assert step["train/groups"] == 2 and step["tokens/trained_total"] > 0 and step["val/episodes"] == 2
    assert (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    assert (run_dir / "aworld_logs" / "llm.log").stat().st_size > 0


@pytest.mark.slow
def test_agent_trainer_trains_the_example_with_the_local_backbone(tmp_path):
    result = run_smoke([sys.executable, str(EXAMPLE / "train.py"), "--backbone", "local", "--run-dir",
                        str(tmp_path / "run")], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_trained(tmp_path / "run")
    assert not (tmp_path / "logs").exists()  # AWorld's logs went to the run directory, none to ./logs


@pytest.mark.slow
def test_the_cli_trains_the_example_with_the_local_backbone(tmp_path):
    agenttune = Path(sys.executable).with_name("agenttune")
    result = run_smoke([str(agenttune), "train", "--conf", "examples/gaia_aworld/gaia_aworld_smoke.yaml",
                        "--backbone", "local", "--run-dir", str(tmp_path / "run")], cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_trained(tmp_path / "run")


def test_an_aworld_agent_config_file_is_accepted_as_aworld_train_does(tmp_path):
    from agenttune.plugin_api import load_reference

    path = tmp_path / "agent.yaml"
    path.write_text("name: yaml_agent\nsystem_prompt: Answer inside <answer></answer>.\n"
                    "conf:\n  llm_config: {llm_provider: openai, llm_model_name: gpt-4o, llm_api_key: unused}\n",
                    encoding="utf-8")
    trainer = AgentTrainer(agent=str(path), config=debug_config(), reward_func=gaia_reward_func,
                           train_dataset=TASKS, train_engine_name="debug")
    agent = load_reference(trainer.config.section("aworld").agent)
    assert (agent.name(), agent.system_prompt) == ("yaml_agent", "Answer inside <answer></answer>.")
    assert trainer.config.workflow == "agenttune_aworld.workflow:AgentWorkflow"
    assert trainer.config.judge.type == "reward_function"
    assert trainer.config.judge.options() == {"function": "gaia_reward:gaia_reward_func"}
