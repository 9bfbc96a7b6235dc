"""A task reader that hangs ends the run with one clear paragraph, never a hang (readers/deadline.py).

The readers are real plugins registered with `register_plugin`; they block in `time.sleep` (sync) or
block their event loop (async), as a reader waiting on a dead server would. The CLI runs are the
ones a user types: `config check`, `data preview`, and `train --backbone debug` on the tiny model
with the scripted engine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import ClassVar

import pytest
from pydantic import BaseModel

from agenttune.components.readers.base import TaskReader
from agenttune.components.readers.deadline import check_splits, read_tasks
from agenttune.errors import UserError
from agenttune.workflow.task import Task

FOREVER_S = 3600
closed = threading.Event()  # set when a reader's generator was closed (its `finally` ran)


class SleepyOptions(BaseModel):
    tasks_before_hanging: int = 0
    seconds_between_tasks: float = 0.0
    tasks: int = 3


class SleepyReader(TaskReader):
    """Yields `tasks_before_hanging` tasks, then sleeps forever (a reader waiting on a dead server);
    with `tasks_before_hanging` >= `tasks` it yields them all, `seconds_between_tasks` apart."""

    name: ClassVar[str] = "sleepy"
    Options: ClassVar[type[SleepyOptions]] = SleepyOptions
    options: SleepyOptions

    def read(self, split: str) -> Iterator[Task]:
        try:
            for index in range(self.options.tasks):
                if index >= self.options.tasks_before_hanging:
                    time.sleep(FOREVER_S)
                time.sleep(self.options.seconds_between_tasks)
                yield Task(task_id=f"{split}-{index}", query=f"question {index}")
        finally:
            closed.set()


class LocalSleepyReader(SleepyReader):
    """The same, read in full by `config check` (like the file reader)."""

    name: ClassVar[str] = "local_sleepy"
    reads_locally = True


class HangingCheckReader(SleepyReader):
    name: ClassVar[str] = "hanging_check"

    def check(self, splits: list[str]) -> None:
        time.sleep(FOREVER_S)


class AsyncReader(TaskReader):
    """An async generator; `block` makes it block its own event loop (time.sleep in async code)."""

    name: ClassVar[str] = "async_tasks"
    block: ClassVar[bool] = False

    async def read(self, split: str) -> AsyncIterator[Task]:  # type: ignore[override]
        for index in range(2):
            await asyncio.sleep(0.01)
            if self.block and index == 1:
                time.sleep(FOREVER_S)
            yield Task(task_id=f"{split}-{index}", query="q")


class BlockingAsyncReader(AsyncReader):
    name: ClassVar[str] = "blocking_async"
    block: ClassVar[bool] = True


def sleepy(**options) -> SleepyReader:
    return SleepyReader(SleepyOptions(**options))


def assert_hang_message(error: str, reader: str, split: str, timeout: str) -> None:
    for fragment in (f"The task reader {reader!r}", f"split {split!r}", f"{timeout} s", "task_reader.read_timeout"):
        assert fragment in error, error


# -- the helper itself ------------------------------------------------------------------------------------
def test_a_reader_that_hangs_raises_a_user_error_after_the_timeout():
    started = time.monotonic()
    with pytest.raises(UserError) as raised:
        list(read_tasks(sleepy(), "train", timeout=0.5))
    assert 0.4 < time.monotonic() - started < 3
    assert_hang_message(str(raised.value), "sleepy", "train", "0.5")
    assert "after 0 task(s)" in str(raised.value)


def test_a_reader_that_hangs_after_some_tasks_says_how_many_it_gave():
    tasks = []
    with pytest.raises(UserError, match=r"after 2 task\(s\)"):
        for task in read_tasks(sleepy(tasks_before_hanging=2), "train", timeout=0.5):
            tasks.append(task.task_id)
    assert tasks == ["train-0", "train-1"]  # handed over as soon as they existed, not held back


def test_a_slow_reader_under_the_timeout_is_read_in_full():
    reader = sleepy(tasks_before_hanging=99, seconds_between_tasks=0.3, tasks=4)
    started = time.monotonic()
    tasks = list(read_tasks(reader, "train", timeout=1.0))  # 1.2 s in all, 0.3 s per task
    assert [task.task_id for task in tasks] == [f"train-{index}" for index in range(4)]
    assert time.monotonic() - started >= 1.2


def test_the_tasks_a_caller_needs_come_back_even_if_the_reader_hangs_after_them():
    closed.clear()
    tasks = list(read_tasks(sleepy(tasks_before_hanging=1), "train", timeout=0.5, limit=1))
    assert [task.task_id for task in tasks] == ["train-0"]


def test_a_caller_that_stops_early_closes_the_readers_generator():
    closed.clear()
    reader = sleepy(tasks_before_hanging=99, tasks=5000)
    assert len(list(read_tasks(reader, "train", timeout=5, limit=3))) == 3
    # Generous: it returns as soon as the reader's thread closes the generator, which on a loaded machine
    # (a CI run beside two training jobs) once took longer than 5 s.
    assert closed.wait(30), "the reader's generator was not closed"


def test_the_readers_own_errors_reach_the_caller_unchanged():
    class Broken(SleepyReader):
        def read(self, split):
            yield Task(task_id="a", query="q")
            raise UserError("task_reader.path: row 2 is not JSON.")

    tasks = []
    with pytest.raises(UserError, match="row 2 is not JSON"):
        tasks.extend(read_tasks(Broken(), "train", timeout=5))
    assert [task.task_id for task in tasks] == ["a"]


def test_sys_exit_in_a_reader_is_its_error_not_the_callers_exit():
    class Exiting(SleepyReader):
        def read(self, split):
            raise SystemExit(3)

    with pytest.raises(RuntimeError, match="SystemExit"):
        list(read_tasks(Exiting(), "train", timeout=5))


def test_an_async_reader_is_read_and_one_that_blocks_its_loop_times_out():
    assert [task.task_id for task in read_tasks(AsyncReader(), "train", timeout=5)] == ["train-0", "train-1"]
    with pytest.raises(UserError, match=r"'blocking_async' produced no task of split 'train' for 0.5 s"):
        list(read_tasks(BlockingAsyncReader(), "train", timeout=0.5))


def test_a_check_that_hangs_raises_and_one_that_fails_keeps_its_error():
    with pytest.raises(UserError, match=r"'hanging_check' did not finish check\(\['train'\]\) in 0.5 s"):
        check_splits(HangingCheckReader(), ["train"], timeout=0.5)

    class Failing(SleepyReader):
        def check(self, splits):
            raise UserError("task_reader.path: 'x' does not exist.")

    with pytest.raises(UserError, match="does not exist"):
        check_splits(Failing(), ["train"], timeout=5)


# -- the commands a user runs -------------------------------------------------------------------------------
@pytest.fixture
def project(tmp_path, write_yaml, register_plugin):
    """A debug-backbone config on the tiny model with the scripted engine; `reader` picks the task reader."""
    register_plugin(task_readers=[SleepyReader, LocalSleepyReader, HangingCheckReader],
                    distribution="agenttune-test-sleepy-readers")
    (tmp_path / "sleepy_workflow.py").write_text(
        "from agenttune import Workflow, WorkflowOutput\n\n"
        "class Echo(Workflow):\n"
        "    async def execute(self, task, tuner):\n"
        "        return WorkflowOutput(reward=1.0)\n", encoding="utf-8")

    def write(reader: dict) -> object:
        return write_yaml({"workflow": "sleepy_workflow:Echo", "backbone": "debug",
                           "task_reader": {"read_timeout": 1, **reader},
                           "model": {"path": "tiny://default", "max_model_len": 1024},
                           "engine": {"type": "scripted", "replies": ["42"], "cycle": True},
                           "rollout": {"num_repeat": 2, "max_response_length_in_one_turn": 16}})

    return write


def assert_one_paragraph(result, started: float) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    paragraph = result.error[result.error.index("Error: "):]
    assert paragraph.count("\n") == 1, paragraph
    assert time.monotonic() - started < 30  # the timeout is 1 s: the rest is loading the tiny model


def test_train_with_a_reader_that_hangs_ends_with_the_message(run_cli, project, tmp_path):
    started = time.monotonic()
    result = run_cli("train", "--conf", project({"type": "sleepy"}), "--run-dir", tmp_path / "run")
    assert_one_paragraph(result, started)
    assert_hang_message(result.error, "sleepy", "train", "1")


def test_config_check_with_a_reader_that_hangs_ends_with_the_message(run_cli, project):
    for reader, expected in [("local_sleepy", "split 'train'"), ("hanging_check", "check(['train'])")]:
        started = time.monotonic()
        result = run_cli("config", "check", "--conf", project({"type": reader}))
        assert_one_paragraph(result, started)
        assert f"The task reader {reader!r}" in result.error and expected in result.error, result.error


def test_data_preview_with_a_reader_that_hangs_ends_with_the_message(run_cli, project):
    result = run_cli("data", "preview", "--conf", project({"type": "sleepy"}))
    assert result.exit_code == 2 and "task_reader.read_timeout (now 1 s)" in result.error, result.output


def test_a_slow_reader_under_the_timeout_trains_and_previews(run_cli, project, tmp_path):
    conf = project({"type": "sleepy", "tasks_before_hanging": 99, "seconds_between_tasks": 0.4, "tasks": 2})
    result = run_cli("train", "--conf", conf, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "Rolling out 2 task(s) x 2" in result.stdout
    preview = run_cli("data", "preview", "--conf", conf, "--json")
    assert preview.exit_code == 0 and preview.stdout.count('"task_id"') == 2, preview.output
