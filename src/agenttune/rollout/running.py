"""Running user code so that it cannot take the run down with it, in this process or in a worker.

The rollout engine (in this process) and the workflow processes (workers.py) both call workflows
and describe their errors, and a backbone's main and a worker's main both end their event loop
with `run_until_done`; these sit here, below both, so that neither imports the other's module.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import traceback
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from agenttune.workflow.base import Workflow
    from agenttune.workflow.task import Task
    from agenttune.workflow.tuner import ModelTuner

# How much of a traceback an episode keeps: the innermost frames, where the user's code failed.
ERROR_CHARS = 4000
# How long leftover tasks (episodes abandoned after a timeout) get to stop when the run ends.
SHUTDOWN_GRACE_S = 5.0

T = TypeVar("T")


class WorkflowProcessError(Exception):
    """The workflow failed in a worker process; `description` is its error and traceback there.
    `environment`: the error was an EnvironmentFailure (the episode's status says the environment failed)."""

    def __init__(self, description: str, *, environment: bool = False):
        super().__init__(description.splitlines()[0] if description else "the workflow failed")
        self.description = description
        self.environment = environment


async def call_workflow(workflow_cls: type[Workflow], task: Task, tuner: ModelTuner) -> Any:
    """A fresh workflow's `execute(task, tuner)`: awaited, or in its own thread when it is sync."""
    workflow = workflow_cls()
    if not inspect.iscoroutinefunction(workflow.execute):
        result = await run_in_thread(workflow.execute, task, tuner)
        return await result if inspect.isawaitable(result) else result
    try:
        return await workflow.execute(task, tuner)
    except SystemExit as exit_:  # would stop the event loop, and every other episode with it
        raise RuntimeError(f"the workflow called sys.exit({exit_.code})") from None


async def run_in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """Run blocking code in its own daemon thread and await its result.

    Not `asyncio.to_thread`: its shared pool has a few workers, so a handful of hung sync
    workflows would starve every later episode (and block interpreter exit). A daemon thread
    that never returns is abandoned on timeout instead.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(error: BaseException | None, result: Any) -> None:
        if future.done():  # timed out or cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = context.run(function, *args), None
        except Exception as raised:  # handed to the awaiting task, which records it
            result, error = None, raised
        except BaseException as raised:  # sys.exit() in user code must not stop the event loop
            result, error = None, RuntimeError(f"{getattr(function, '__qualname__', 'the call')} raised "
                                               f"{type(raised).__name__}({raised})")
        try:
            loop.call_soon_threadsafe(settle, error, result)
        except RuntimeError:  # the loop closed while this thread ran past its timeout
            pass

    threading.Thread(target=target, daemon=True, name=f"agenttune-{getattr(function, '__qualname__', 'call')}").start()
    return await future


def describe(error: BaseException) -> str:
    """`Type: message` and the innermost frames of the traceback, for Episode.error.

    An error from a workflow process was described there, with the frames that matter.
    """
    if isinstance(error, WorkflowProcessError):
        return error.description
    text = "".join(traceback.format_exception(error)).rstrip()
    head = f"{type(error).__name__}: {error}"
    if len(text) > ERROR_CHARS:
        text = "...\n" + text[-ERROR_CHARS:]
    return f"{head}\n{text}"


def run_until_done(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` for backbones: leftovers cannot keep the run from ending.

    `asyncio.run` waits, at exit, for every task still alive, and for the threads of its default
    executor. A workflow that swallows cancellation, or a blocking call stuck in `asyncio.to_thread`,
    would then hang the program after its work is done. Here leftovers get `SHUTDOWN_GRACE_S`
    seconds after being cancelled, and are then abandoned.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            leftovers = asyncio.all_tasks(loop)
            for task in leftovers:
                task.cancel()
            if leftovers:
                loop.run_until_complete(asyncio.wait(leftovers, timeout=SHUTDOWN_GRACE_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()  # shuts the default executor down without waiting for its threads
