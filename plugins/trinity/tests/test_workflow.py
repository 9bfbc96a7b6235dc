"""The Trinity workflow adapter, end to end on CPU.

What runs for real: agenttune's file reader writes the taskset; Trinity's own config loader, validators
and task file reader read it back into Trinity `Task`s; Trinity's `ModelWrapper` (its `prepare()`
polls the server's /health) hands our workflow the rollout model; the user's multi-turn tool agent
talks to agenttune's gateway; the gateway's engine sends token ids over HTTP to the rollout server;
the agenttune judge scores; Experiences come back. What is fake: the vLLM server (a loopback HTTP
server with scripted replies tokenized by the tiny model's real tokenizer) and the Ray actor handle
behind the ModelWrapper, which this path never calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agenttune_trinity.launch import (
    check_and_update,
    load_trinity_config,
    write_tasksets,
    write_trinity_config,
)
from agenttune_trinity.stack import close_all
from agenttune_trinity.translation import TrinityPaths, trinity_config
from fake_vllm import FakeVLLMServer

from agenttune.plugin_api import prepare_run, read_records, resolve
from agenttune.testing.loopback import serve_app

TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>'


class Scripted:
    """Call the tool first; then answer right the first time, wrong the second (a group with signal)."""

    def __init__(self) -> None:
        self.answers = iter(["The answer is 42.", "The answer is 41."])

    def __call__(self, prompt_text: str) -> str:
        return TOOL_CALL if "<tool_response>" not in prompt_text else next(self.answers)


class NotARayActor:
    """Stands where Trinity puts the vLLM actor handle; the OpenAI-API path never calls it."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the trinity engine called the rollout actor's {name!r}; it should use HTTP")


@pytest.fixture
def trinity_run(make_config, tmp_path: Path, tiny_model_path: Path):
    """A run directory prepared as `agenttune train --backbone trinity` prepares it, and Trinity's config."""
    config = make_config()
    run = prepare_run(config, tmp_path / "run")
    components = resolve(config)
    paths = TrinityPaths.for_run(run.run_dir, str(tiny_model_path))
    cfg = load_trinity_config(write_trinity_config(trinity_config(config, paths), run.run_dir))
    write_tasksets(components, config, Path(paths.tasks))
    check_and_update(cfg)
    return run, cfg


async def trinity_tasks(cfg, count: int):
    from trinity.buffer import get_buffer_reader

    reader = get_buffer_reader(cfg.buffer.explorer_input.tasksets[0])
    tasks = await reader.read(batch_size=count)
    for index, task in enumerate(tasks):
        task.batch_id, task.task_id = 1, index  # what Trinity's explorer assigns
    return tasks


async def prepared_model(cfg, address: str):
    from trinity.common.models.model import ModelWrapper

    model = ModelWrapper(model=NotARayActor(), config=cfg.explorer.rollout_model, api_address=address)
    await model.prepare()  # Trinity's own readiness check: polls GET /health
    return model


async def run_the_40_plus_2_group(cfg, server: FakeVLLMServer, *, repeat: int, run_id_base: int = 0) -> list:
    """What Trinity's runner does with one task: `repeat` episodes of "What is 40 + 2?" against `server`."""
    with serve_app(server.app()) as address:
        model = await prepared_model(cfg, address)
        [task] = [t for t in await trinity_tasks(cfg, 3) if json.loads(t.raw_task["agenttune_task"])["query"]
                  == "What is 40 + 2?"]
        workflow = task.to_workflow(model)
        workflow.set_repeat_times(repeat, run_id_base=run_id_base)
        try:
            return await workflow.run_async()
        finally:
            await close_all()


async def test_multi_turn_tool_episodes_become_experiences(trinity_run, tiny_tokenizer):
    run, cfg = trinity_run
    server = FakeVLLMServer(tiny_tokenizer, Scripted())
    experiences = await run_the_40_plus_2_group(cfg, server, repeat=cfg.algorithm.repeat_times)

    # one Experience per episode (both calls merged into one sample), not one per LLM call
    assert len(server.calls) == 4 and len(experiences) == 2
    assert sorted(experience.eid.run for experience in experiences) == [0, 1]
    by_answer = {}
    for experience in experiences:
        first, second = calls_of(server, experience)
        tokens = experience.tokens.tolist()
        # prompt: the first call's prompt ids, exactly as the engine received them
        assert experience.prompt_length == len(first.prompt_ids)
        assert tokens[:experience.prompt_length] == first.prompt_ids
        # response: call 1's generated ids, the tool result glue, call 2's generated ids
        assert tokens[:len(second.prompt_ids)] == second.prompt_ids
        assert second.prompt_ids[:len(first.prompt_ids) + len(first.token_ids)] == first.prompt_ids + first.token_ids
        assert tokens[len(second.prompt_ids):] == second.token_ids
        mask = experience.action_mask.tolist()
        logprobs = experience.logprobs.tolist()
        glue = len(second.prompt_ids) - len(first.prompt_ids) - len(first.token_ids)
        assert glue > 0 and "<tool_response>" in tiny_tokenizer.decode(
            tokens[len(first.prompt_ids) + len(first.token_ids):len(second.prompt_ids)])
        assert mask == [True] * len(first.token_ids) + [False] * glue + [True] * len(second.token_ids)
        assert logprobs == pytest.approx(first.logprobs + [0.0] * glue + second.logprobs)
        answer = tiny_tokenizer.decode(second.token_ids, skip_special_tokens=True)
        by_answer[answer] = experience
    right, wrong = by_answer["The answer is 42."], by_answer["The answer is 41."]
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.info["agenttune_success"] and not wrong.info["agenttune_success"]
    assert {experience.info["agenttune_task_id"] for experience in experiences} == {"add-1"}
    # the group's step metrics ride on one Experience (Trinity averages them over a step's tasks)
    with_metrics = [experience for experience in experiences if experience.metrics]
    assert len(with_metrics) == 1 and with_metrics[0].metrics["reward/mean"] == 0.5
    # sampling came from Trinity's rollout args for the task (agenttune's rollout.* via the taskset)
    assert {call.body["temperature"] for call in server.calls} == {0.9}
    assert all(call.body["max_tokens"] <= 96 for call in server.calls)

    [log_file] = list((run.run_dir / "rollouts").glob("*.jsonl"))
    assert log_file.name == "step_000001_train.jsonl"
    records = list(read_records(log_file))
    assert sorted(record.reward for record in records) == [0.0, 1.0]


async def test_experiences_round_trip_through_trinitys_serialization(trinity_run, tiny_tokenizer):
    """What the runner ships to the buffer (Experience.serialize_many) keeps every field we set."""
    from trinity.common.experience import Experience

    run, cfg = trinity_run
    server = FakeVLLMServer(tiny_tokenizer, Scripted())
    experiences = await run_the_40_plus_2_group(cfg, server, repeat=2, run_id_base=4)
    restored = Experience.deserialize_many(Experience.serialize_many(experiences))
    assert [e.eid.run for e in restored] == [e.eid.run for e in experiences] and {e.eid.run for e in restored} == {4, 5}
    for before, after in zip(experiences, restored, strict=True):
        assert after.tokens.tolist() == before.tokens.tolist()
        assert after.action_mask.tolist() == before.action_mask.tolist()
        assert after.logprobs.tolist() == pytest.approx(before.logprobs.tolist())
        assert (after.prompt_length, after.reward) == (before.prompt_length, before.reward)


async def test_a_failing_episode_does_not_fail_the_group(trinity_run, tiny_tokenizer):
    """The server fails every request but the first episode's: that one trains, the other is logged."""
    run, cfg = trinity_run
    state = {"first_calls": 0}

    def reply(prompt_text: str) -> str | None:
        if "<tool_response>" in prompt_text:
            return "The answer is 42."
        state["first_calls"] += 1
        return TOOL_CALL if state["first_calls"] == 1 else None  # None: HTTP 500

    server = FakeVLLMServer(tiny_tokenizer, reply)
    experiences = await run_the_40_plus_2_group(cfg, server, repeat=2)
    records = list(read_records(run.run_dir / "rollouts" / "step_000001_train.jsonl"))
    failed = [record for record in records if record.status.failed]
    assert len(records) == 2 and len(failed) == 1, [record.status for record in records]
    assert "500" in (failed[0].error or ""), failed[0].error
    [experience] = experiences
    assert experience.reward == 1.0 and experience.action_mask.any()
    assert experience.metrics["failure_rate"] == 0.5


def calls_of(server: FakeVLLMServer, experience) -> tuple:
    """The two server calls whose ids and logprobs make up this experience (call 2 extends call 1).

    Both episodes' first calls look alike (same prompt, same scripted tool call); the logprobs, which
    the fake makes distinct per call, tell them apart.
    """
    tokens, logprobs = experience.tokens.tolist(), experience.logprobs.tolist()
    start = experience.prompt_length

    def holds(call) -> bool:
        end = len(call.prompt_ids) + len(call.token_ids)
        return (tokens[:len(call.prompt_ids)] == call.prompt_ids and tokens[len(call.prompt_ids):end] == call.token_ids
                and logprobs[len(call.prompt_ids) - start:end - start] == pytest.approx(call.logprobs))

    mine = [call for call in server.calls if holds(call)]
    assert len(mine) == 2, f"expected the experience to hold exactly two calls, found {len(mine)}"
    return tuple(sorted(mine, key=lambda call: len(call.prompt_ids)))
