"""A watchdog for workflows that block the event loop they run on.

An `async def execute` that calls `time.sleep`, a blocking socket, or loops without awaiting
freezes the loop: no timer fires, so `rollout.episode_timeout` (an `asyncio.wait` timeout) never
does either. The watchdog is a daemon thread. The engine runs each workflow coroutine through
`LoopWatchdog.watch`, which marks every step of it (each stretch of its code between two awaits)
with the episode and its deadline. When one step is still running past its episode's deadline, the
thread sends SIGUSR2 to the main thread; the handler raises `LoopBlocked` there, inside the stuck
step (a blocking call returns early with EINTR and the handler runs then; a busy loop is stopped
at its next bytecode). The workflow's task fails with it and the engine ends the episode
`workflow_blocked`. The handler raises only while a workflow's step is marked, so agenttune's own
code is never interrupted.

Limits: signal handlers run in the main thread only, so this works where the loop runs there (the
debug and local backbones); elsewhere the watchdog warns once and does nothing. Code that blocks
inside a C extension with signals masked, or that retries on EINTR itself, is not stopped: run such
workflows in worker processes (`rollout.workflow_processes` > 1), which are killed and replaced.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any

from agenttune.config.run import get_logger

log = get_logger("rollout")

SIGNAL = signal.SIGUSR2
# How often the thread looks, and how long a step that swallowed LoopBlocked gets before the next one.
POLL_S = 0.1
REFIRE_S = 1.0
STACK_FRAMES = 8


class LoopBlocked(BaseException):
    """Raised inside a workflow step that blocked the event loop past its episode's deadline.

    A BaseException, like CancelledError: an agent loop's `except Exception: retry` must not swallow it.
    """


@dataclass
class _Step:
    episode_id: str
    deadline: float  # time.monotonic()
    where: str = field(default="")  # the main thread's stack when the watchdog fired


class LoopWatchdog:
    """Stops workflow steps that block the event loop past their episode's deadline (see the module doc)."""

    def __init__(self) -> None:
        self._stepping: _Step | None = None
        self._firing: _Step | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._previous_handler: Any = None
        self._main_ident = threading.main_thread().ident
        self._warned = False

    @property
    def active(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Install the handler and start the thread; a no-op off the main thread (with one warning)."""
        if self._thread is not None:
            return
        if threading.current_thread() is not threading.main_thread():
            if not self._warned:
                self._warned = True
                log.warning("the event loop runs outside the main thread: an async workflow that blocks it "
                            "cannot be interrupted here; set rollout.workflow_processes > 1 to run workflows in "
                            "worker processes that are killed when they block")
            return
        self._previous_handler = signal.signal(SIGNAL, self._interrupt)
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="agenttune-loop-watchdog")
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and restore the previous handler."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=2 * POLL_S + 1)
        try:
            signal.signal(SIGNAL, self._previous_handler if self._previous_handler is not None else signal.SIG_DFL)
        except ValueError:  # stopped from another thread: leave the (then harmless) handler in place
            pass

    async def watch(self, coroutine: Coroutine[Any, Any, Any], episode_id: str, deadline: float) -> Any:
        """Await `coroutine`, each of its steps marked with `episode_id` and `deadline` (time.monotonic())."""
        step = _Step(episode_id, deadline)
        return await _Marked(coroutine, self, step)

    # -- in the main thread ------------------------------------------------------------------------
    def _interrupt(self, signum: int, frame: Any) -> None:
        step = self._firing
        if step is None or self._stepping is not step:  # the step ended before the signal arrived
            return
        raise LoopBlocked(f"the workflow blocked the event loop past rollout.episode_timeout (episode "
                          f"{step.episode_id}): await instead of blocking, or set rollout.workflow_processes > 1 "
                          f"to run workflows in worker processes; it was interrupted in:\n{step.where}")

    # -- in the watchdog thread --------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            step = self._stepping
            if step is None or time.monotonic() < step.deadline:
                continue
            step.where = self._main_stack()
            log.warning("a workflow blocks the event loop past its deadline; interrupting it",
                        episode=step.episode_id, where=_innermost(step.where))
            self._firing = step
            signal.pthread_kill(self._main_ident or 0, SIGNAL)
            step.deadline = time.monotonic() + REFIRE_S  # again if it swallowed LoopBlocked

    def _main_stack(self) -> str:
        frame = sys._current_frames().get(self._main_ident or 0)
        if frame is None:
            return "(unknown)"
        return "".join(traceback.format_stack(frame, limit=STACK_FRAMES))


class _Marked:
    """An awaitable that drives a coroutine step by step, marking each step on the watchdog."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any], watchdog: LoopWatchdog, step: _Step):
        self._coroutine, self._watchdog, self._step = coroutine, watchdog, step

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, watchdog, step = self._coroutine, self._watchdog, self._step
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            outer, watchdog._stepping = watchdog._stepping, step
            try:
                yielded = coroutine.throw(thrown) if thrown is not None else coroutine.send(sent)
            except StopIteration as stop:
                return stop.value
            finally:
                watchdog._stepping = outer
            try:
                sent, thrown = (yield yielded), None
            except GeneratorExit:  # the awaiting coroutine is being closed: close the workflow's too
                coroutine.close()
                raise
            except BaseException as error:  # cancellation and the like: handed to the workflow
                sent, thrown = None, error


def _innermost(stack: str) -> str:
    """The last `File ..., line ..., in ...` line of a formatted stack: where it was blocked."""
    lines = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
    return lines[-1] if lines else stack.strip()
