"""`tuner.add_cleanup`: callbacks run once the episode is over — after the judge, and also when the
workflow raised or timed out — so a judge can still use what the workflow opened (an environment)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agenttune import Judge, JudgeInput, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.registry.config_loading import build_config
from agenttune.rollout.session import rollout_session
from agenttune.workflow.episode import EpisodeStatus

TINY = "tiny://cleanup?layers=1&hidden=32&heads=2&kv_heads=1&intermediate=64"
EVENTS: list[str] = []


class Resource:
    """Stands for an environment instance: usable until released."""

    def __init__(self, name: str):
        self.name, self.released = name, False

    async def release(self) -> None:
        self.released = True
        EVENTS.append(f"release {self.name}")


class OpensResource(Workflow):
    async def execute(self, task: Task, tuner: Any) -> WorkflowOutput:
        resource = Resource(task.task_id)
        tuner.add_cleanup(resource.release)
        tuner.add_cleanup(lambda: EVENTS.append(f"plain cleanup {task.task_id}"))  # sync callbacks work too
        tuner.update_judge_input_dictionary(resource=resource)
        if task.metadata.get("mode") == "raise":
            raise RuntimeError("boom")
        if task.metadata.get("mode") == "hang":
            import asyncio

            await asyncio.sleep(3600)
        return WorkflowOutput()


class UsesResource(Judge):
    name = "uses_resource"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        resource = judge_input.handed["resource"]
        EVENTS.append(f"judge {resource.name} released={resource.released}")
        return JudgeResult(reward=1.0, success=True)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "status", "judged"), [
    ("ok", EpisodeStatus.OK, True),
    ("raise", EpisodeStatus.WORKFLOW_ERROR, False),
    ("hang", EpisodeStatus.TIMEOUT, False),
])
async def test_cleanups_run_after_the_judge_and_after_failures(mode: str, status: EpisodeStatus, judged: bool,
                                                                tmp_path: Path) -> None:
    EVENTS.clear()
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text('{"query": "q"}\n')
    config = build_config({
        "workflow": "test_judges_episode_cleanup:OpensResource",
        # In this process: the judge reads the live object the workflow handed it (a worker process
        # would get a pickled copy) and records into this module's EVENTS.
        "judge": {"type": "custom", "judge_protocol": "test_judges_episode_cleanup:UsesResource",
                  "isolation": "thread"},
        "backbone": "debug",
        "task_reader": {"type": "file", "path": str(tasks_file)},  # unused: the test hands the task over
        "model": {"path": TINY},
        "engine": {"type": "scripted", "replies": ["unused"]},
        "rollout": {"num_repeat": 1, "episode_timeout": 1.0},
    }, {})
    async with rollout_session(config) as session:
        task = Task(task_id=f"t-{mode}", query="q", metadata={"mode": mode})
        [episode] = await session.rollout.run_tasks([task])
    assert episode.status is status
    expected = ([f"judge t-{mode} released=False"] if judged else []) + [
        f"plain cleanup t-{mode}", f"release t-{mode}"]  # last added runs first
    assert EVENTS == expected
