"""examples/two_policies: a proposer and a checker with opposed goals on the quickstart's arithmetic, each agent sampling and
training its own LoRA adapter. Runs the example's own run.py (data, a shortened warm-up, `agenttune
train`) with the debug and the local backbone on the tiny model."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from agenttune.rollout.log import read_records

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "two_policies"
pytest.importorskip("peft")


def example_run():
    spec = importlib.util.spec_from_file_location("two_policies_run", EXAMPLE / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLE))
    spec.loader.exec_module(module)
    return module


def records(run_dir: Path, step: int, split: str):
    return list(read_records(run_dir / "rollouts" / f"step_{step:06d}_{split}.jsonl"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The example's data and its base model, warmed up for 2 steps only (the real warm-up takes minutes)."""
    data = tmp_path_factory.mktemp("two_policies") / "data"
    example_run().prepare(data, conversations=20, warmup_steps=2)
    return data


def test_the_warm_up_shows_the_checker_its_format_with_right_and_wrong_proposals(data):
    """Half the demonstrations are the checker's: a proposal, right or one digit off, and the right answer."""
    team = importlib.import_module("team")  # examples/two_policies/team.py (example_run() put it on the path)
    demos = [json.loads(line) for line in (data / "demos.jsonl").read_text().splitlines()]
    checker = [demo for demo in demos if demo["messages"][0]["content"] == team.CHECKER_PROMPT]
    assert len(checker) == len(demos) // 2 == 20
    right = wrong = 0
    for demo in checker:
        messages = demo["messages"]
        for at, message in enumerate(messages):
            if message["role"] != "user":
                continue
            question = re.fullmatch(r"What is (\d+) \* (\d+)\? Proposed: The answer is (\d+)\.", message["content"])
            assert question, message["content"]
            a, b, proposed = map(int, question.groups())
            answer = next(m for m in messages[at + 1:] if m["role"] == "assistant" and m["content"])
            assert answer["content"] == f"The answer is {a * b}."
            right, wrong = right + (proposed == a * b), wrong + (proposed != a * b)
            assert len(str(proposed)) == len(str(a * b))  # a wrong one is one digit off, not told by its length
    assert right > 0 and wrong > 0


@pytest.mark.parametrize(("proposed", "final", "proposer", "checker"), [
    (9716, 9716, 0.0, 1.0),  # right and vouched for: the checker's point
    (9746, 9716, 1.0, 1.0),  # a plausible wrong answer, caught: a point each
    (9746, 9746, 1.0, 0.0),  # a plausible wrong answer, copied: the proposer's point only
    (97, 9716, 0.0, 1.0),    # wrong, but its length gives it away: no point for the proposer
    (None, None, 0.0, 0.0),
])
def test_the_judge_rewards_opposed_goals(proposed, final, proposer, checker):
    from agenttune import JudgeInput, WorkflowOutput
    from agenttune.workflow.task import Task

    example_run()  # puts the example's directory on sys.path
    from team import TeamJudge

    task = Task(task_id="t", query="What is 347 * 28?", metadata={"ground_truth": "9716"})
    output = WorkflowOutput(metadata={"final_answer": final, "proposed_answer": proposed})
    result = TeamJudge().judge(JudgeInput(task=task, output=output))
    assert result.agent_rewards == {"proposer": proposer, "checker": checker}
    assert result.reward == checker and result.success == bool(checker)  # the team's answer is the checker's


def test_the_debug_backbone_runs_both_agents_and_judges_the_team(data, tmp_path):
    run_dir = example_run().main(["--backbone", "debug", "--run-dir", str(tmp_path / "run"),
                                  "debug.first_n_tasks=2", "rollout.num_repeat=1"], data=data)
    episodes = records(run_dir, 1, "train")
    assert len(episodes) == 2
    for episode in episodes:
        assert not episode.status.failed, episode.error  # (`madness`: a model warmed up for 2 steps babbles)
        assert [sample.agent for sample in episode.samples][:1] == ["proposer"]
        assert "checker" in {sample.agent for sample in episode.samples}
        assert episode.reward in (0.0, 1.0) and episode.reward == float(episode.success)
        assert episode.judge_details["expected"] == episode.task.metadata["ground_truth"]
        # The checker was shown the proposer's answer (or "no answer") after the problem.
        user = [m["content"] for m in episode.messages if m["role"] == "user"]
        assert user[-1].startswith(episode.task.query + " Proposed: ")


@pytest.mark.slow
def test_the_local_backbone_trains_one_adapter_per_agent(data, tmp_path):
    """One RL step: each agent's samples were sampled by its own policy's adapter and train that policy."""
    run_dir = example_run().main([
        "--run-dir", str(tmp_path / "run"), "trainer.total_steps=1", "trainer.test_freq=1",
        "data.train_batch_size=2", "rollout.num_repeat=2", "data.val_batch_size=4",
        "local.plot=false", "monitor.tensorboard=false"], data=data)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics] == [0, 1]
    assert metrics[0]["val/episodes"] == 4 and metrics[1]["val/episodes"] == 4
    for policy in ("proposer", "checker"):
        assert metrics[1][f"policy/{policy}/train/samples"] > 0
    assert metrics[1].get("unknown_agent_calls", 0) == 0  # (written when not 0)
    for episode in records(run_dir, 1, "train"):
        assert {(sample.agent, sample.policy) for sample in episode.samples} <= {("proposer", "proposer"),
                                                                                 ("checker", "checker")}
        assert episode.policies == ["checker", "proposer"]
