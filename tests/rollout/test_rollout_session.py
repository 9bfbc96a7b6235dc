"""The rollout session every backbone builds on, and `run_until_done`."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.config.run import prepare_run
from agenttune.errors import UserError
from agenttune.rollout.session import rollout_session, run_until_done
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import tiny_config

JUDGE_MODULE = '''
from agenttune import Judge, JudgeResult, Workflow, WorkflowOutput

closed = []


class EchoWorkflow(Workflow):
    async def execute(self, task, tuner):
        reply = await tuner.as_async_openai_client().chat.completions.create(
            model=tuner.model_name, messages=[{"role": "user", "content": task.query}])
        tuner.update_judge_input_dictionary(final_answer=reply.choices[0].message.content)
        return WorkflowOutput()


class LengthJudge(Judge):
    def judge(self, judge_input):
        return JudgeResult(reward=len(judge_input.final_answer) / 10, success=True)

    async def aclose(self):
        closed.append(self)
'''


@pytest.fixture
def session_config(tmp_path, monkeypatch):
    (tmp_path / "session_parts.py").write_text(textwrap.dedent(JUDGE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"task_id": "t{i}", "query": "Say {i}."}}\n' for i in range(5)))
    return tiny_config(workflow="session_parts:EchoWorkflow", backbone="debug",
                       task_reader={"type": "file", "path": str(tasks)},
                       judge={"judge_protocol": "session_parts:LengthJudge"},
                       engine={"type": "scripted", "replies": ["Done."]}, rollout={"num_repeat": 2})


async def test_session_builds_the_stack_records_steps_and_closes_what_it_built(session_config, tmp_path):
    import session_parts

    run = prepare_run(session_config, tmp_path / "run")
    async with rollout_session(session_config, run=run) as session:
        gateway = session.gateway
        assert gateway.port is not None and isinstance(session.engine, ScriptedEngine)
        tasks = session.tasks("train", limit=3)
        assert [task.task_id for task in tasks] == ["t0", "t1", "t2"]
        episodes = await session.rollout.run_tasks(tasks)
        train = session.record(1, "train", episodes)
        validation = session.record(1, "validation", episodes[:2])
        session.metrics_log.write(1, {**train, **validation})
    assert gateway.port is None  # stopped
    assert session_parts.closed == [session.judge]
    assert [episode.reward for episode in episodes] == [0.5] * 6  # len("Done.") / 10
    assert train["episodes"] == 6 and validation["val/episodes"] == 2
    assert sorted(path.name for path in run.rollouts_dir.iterdir()) == [
        "step_000001_train.jsonl", "step_000001_validation.jsonl"]
    [line] = session.metrics_log.read()
    assert line["step"] == 1 and line["reward/mean"] == 0.5 and line["val/reward/mean"] == 0.5


async def test_a_backbone_brings_its_own_engine_and_keeps_it_open(session_config):
    closed = []

    class OwnEngine(ScriptedEngine):
        async def aclose(self):
            closed.append(self)

    engine = OwnEngine(["Mine."], tokenizer=tiny_tokenizer(), cycle=True)
    async with rollout_session(session_config, engine=engine, tokenizer=tiny_tokenizer()) as session:
        [episode] = await session.rollout.run_tasks(session.tasks("train", limit=1), num_repeat=1)
        assert session.rollout_log is None and session.metrics_log is None  # no run: nothing written
    assert episode.reward == pytest.approx(0.5) and engine.prompts and closed == []


async def test_the_session_is_torn_down_when_the_body_raises(session_config):
    with pytest.raises(RuntimeError, match="backbone bug"):
        async with rollout_session(session_config) as session:
            raise RuntimeError("backbone bug")
    assert session.gateway.port is None


async def test_session_needs_a_workflow(session_config):
    from agenttune.registry.resolution import resolve

    config = session_config.model_copy(update={"workflow": None})
    with pytest.raises(UserError, match="workflow is not set"):
        async with rollout_session(config, components=resolve(config, need_workflow=False)):
            pass


def test_run_until_done_abandons_tasks_that_refuse_to_stop(monkeypatch):
    monkeypatch.setattr("agenttune.rollout.running.SHUTDOWN_GRACE_S", 0.1)
    stop = []

    async def stubborn():
        while not stop:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                pass

    async def main():
        asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0)
        return "finished"

    try:
        assert run_until_done(main()) == "finished"  # asyncio.run would wait for `stubborn` forever
    finally:
        stop.append(True)
