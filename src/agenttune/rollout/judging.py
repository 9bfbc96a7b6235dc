"""Calling the judge so that it cannot hang, exhaust or outlive the run.

`judge.isolation` says where a judge's code runs (a judge class may fix it with its `isolation`):

    process  (default) a pool of `judge.workers` worker processes. Per call, a watchdog on the
             trainer's event loop enforces `judge.timeout` and `judge.memory_limit_mb` (resident
             memory of the worker and all its descendants, polled; plus an address-space limit in
             the worker, so one huge allocation fails at once). On either, the worker's whole process
             tree is killed -- the worker is a child subreaper, so descendants that left its session
             are still in its tree -- and a fresh worker takes the next call.
    thread   in a daemon thread of the trainer (an async judge gets its own event loop there), so a
             judge that blocks cannot freeze the run; the timeout fires and the thread is abandoned.
             No memory limit, and children it starts are not tracked.
    loop     on the trainer's event loop (built-in judges that only await I/O and may be handed live
             clients); the timeout holds as long as the judge awaits.

A call that fails raises `JudgeCallFailed` with the episode status to record: `judge_timeout`,
`judge_memory` or `judge_error`. bench/judge_isolation.py measures what each way costs per call.

A worker process gets a pickled copy of the judge's input: live objects the workflow hands over
(`judge_input.handed`: a client, a lock, an environment handle) either cannot be pickled (or
rebuilt in the worker) -- `JudgeInputNotSendable`, and the rollout engine judges that episode on
its event loop instead, with one warning naming the values and `judge.isolation: loop` -- or
arrive as copies, detached from the trainer's process.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import pickle
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import agenttune.rollout.process_tree as process_tree
from agenttune.config.run import get_logger
from agenttune.errors import UserError
from agenttune.rollout.pipe import MessagePipe, open_pipe
from agenttune.rollout.running import describe, run_in_thread
from agenttune.workflow.episode import EpisodeStatus

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from agenttune.components.judges.base import Judge, JudgeInput
    from agenttune.config.models import JudgeConfig

log = get_logger("judge")

PICKLED_COPY = ("a judge in a worker process (judge.isolation: process, the default) gets a pickled copy of its "
                "input, so such calls run on the trainer's event loop instead (judge.timeout holds while the judge "
                "awaits; no judge.memory_limit_mb or process-tree kill). Set judge.isolation: loop for a judge that "
                "needs the live objects (an async client is bound to that loop), or hand it plain data "
                "(tuner.update_judge_input_dictionary)")

# A worker imports agenttune and the judge's module before it says ready; not part of the call's timeout.
START_TIMEOUT_S = 120.0
# How often the watchdog looks at the worker's memory while a call runs.
POLL_S = 0.05
STOP_TIMEOUT_S = 2.0


class JudgeCallFailed(Exception):
    """The judge did not produce a result; `status` is the episode status to record."""

    def __init__(self, status: EpisodeStatus, message: str):
        super().__init__(message)
        self.status = status


class JudgeInputNotSendable(Exception):
    """The judge's input cannot be pickled for a worker process (it holds live objects): nothing was
    sent, the worker is untouched, and the caller may run this call in its own process instead."""


def isolation_of(judge: Judge, config: JudgeConfig) -> str:
    """Where `judge` runs: its class's `isolation` if set, else `judge.isolation`; `thread` for a
    class a worker process could not import by name (defined in a notebook, say)."""
    chosen = getattr(type(judge), "isolation", None) or config.isolation
    if chosen == "process" and not _importable(judge):
        log.warning("judge runs in a thread", judge=type(judge).__qualname__,
                    why="its class or options cannot be pickled by name for a worker process; define it at "
                        "module level in an importable module to get judge.memory_limit_mb and process-tree kills")
        return "thread"
    return chosen


def _importable(judge: Judge) -> bool:
    try:
        pickle.loads(pickle.dumps((type(judge), judge.options)))
    except Exception:
        return False
    return True


async def call_judge(judge: Judge, judge_input: JudgeInput, timeout: float, isolation: str) -> Any:
    """The judge's return value for `judge_input`, in this process (`thread` or `loop`)."""
    if isolation == "thread":
        call = run_in_thread(_run_to_completion, judge.judge, judge_input)
    elif inspect.iscoroutinefunction(judge.judge):
        call = judge.judge(judge_input)
    else:
        call = run_in_thread(judge.judge, judge_input)
    runner = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({runner}, timeout=timeout)
    except asyncio.CancelledError:
        runner.cancel()
        raise
    if not done:
        runner.cancel()
        abandoned = " (its thread is abandoned)" if isolation == "thread" else ""
        raise JudgeCallFailed(EpisodeStatus.JUDGE_TIMEOUT, f"the judge ran past judge.timeout={timeout:g}s{abandoned}")
    if runner.cancelled():
        raise JudgeCallFailed(EpisodeStatus.JUDGE_ERROR, "the judge was cancelled (it raised CancelledError)")
    error = runner.exception()
    if isinstance(error, MemoryError):
        raise JudgeCallFailed(EpisodeStatus.JUDGE_MEMORY, f"the judge ran out of memory: {describe(error)}")
    if error is not None:
        raise JudgeCallFailed(EpisodeStatus.JUDGE_ERROR, f"the judge raised {describe(error)}")
    return runner.result()


def _run_to_completion(function: Any, *args: Any) -> Any:
    """Call `function`; an awaitable result is run on a fresh event loop (this thread's or process's own)."""
    result = function(*args)
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


# -- worker processes ------------------------------------------------------------------------------------------
@dataclass
class _Worker:
    process: BaseProcess
    pipe: MessagePipe
    replies: asyncio.Queue
    alive: bool = True


class JudgeProcesses:
    """Up to `judge.workers` processes, each running one judge call at a time.

    `await start()` starts them (else they start at first use); a killed one is replaced at the next
    call. `await call(judge_input)` returns the judge's value or raises JudgeCallFailed; `await
    stop()` ends them all (and anything they left running).
    """

    def __init__(self, judge: Judge, config: JudgeConfig):
        self.judge_cls, self.options = type(judge), judge.options
        self.config = config
        self._slots: asyncio.Semaphore | None = None  # one call per worker
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self._context = multiprocessing.get_context("spawn")  # fork would copy the trainer's threads and CUDA

    async def start(self, needed: int | None = None) -> None:
        """Start the workers now (up to `needed`: a batch's episodes), before the first episode, so that
        no call's clock runs while one starts."""
        missing = min(self.config.workers, needed or self.config.workers) - len(self._all)
        results = await asyncio.gather(*(self._spawn() for _ in range(missing)), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise UserError(f"A judge worker process did not start: {result}",
                                hint="Set judge.isolation: thread to run the judge in this process and see why (a "
                                     "slow or failing import in the judge's module, or its __init__ raising?).")
            self._idle.append(result)

    async def call(self, judge_input: JudgeInput) -> Any:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.workers)
        async with self._slots:
            worker = await self._take()
            try:
                value = await self._watch(worker, judge_input)
            except JudgeInputNotSendable:
                self._idle.append(worker)
                raise
            except BaseException:
                self._retire(worker)  # killed, or cancelled mid-call: its state is unknown
                raise
            self._idle.append(worker)
            return value

    async def stop(self) -> None:
        """End every worker, and first whatever its judge left running (the worker adopted it)."""
        workers, self._all, self._idle = self._all, [], []
        for worker in workers:
            left = process_tree.kill_descendants(worker.process.pid or 0)
            if left:
                log.warning("killed processes a judge left running", count=left,
                            hint="a judge's children end with the run at the latest; wait for them inside judge()")
            try:
                worker.pipe.send(None)
            except ConnectionError:
                pass
        for worker in workers:
            if not worker.alive:
                continue  # retired (and ended) by a call that failed or was cancelled while the run stopped
            worker.alive = False  # ours to end now: a call cancelled during the join leaves it alone
            await asyncio.to_thread(worker.process.join, STOP_TIMEOUT_S)
            _end(worker)

    # -- one call ------------------------------------------------------------------------------------------
    async def _watch(self, worker: _Worker, judge_input: JudgeInput) -> Any:
        timeout, limit_mb = self.config.timeout, self.config.memory_limit_mb
        try:
            worker.pipe.send(judge_input)
        except Exception as error:  # whatever an object's __reduce__ raises: that episode's failure, not the batch's
            raise _unsendable(judge_input, error) from None
        deadline = time.monotonic() + timeout
        reply = asyncio.ensure_future(worker.replies.get())
        try:
            while True:
                done, _ = await asyncio.wait({reply}, timeout=POLL_S)
                if done:
                    break
                if not worker.process.is_alive() and worker.replies.empty():
                    await asyncio.sleep(POLL_S)  # a reply written just before it exited is still on its way
                    if worker.replies.empty():
                        raise self._kill(worker, EpisodeStatus.JUDGE_ERROR,
                                         f"the judge's worker process died (exit code {worker.process.exitcode})")
                rss_mb = process_tree.tree_rss(worker.process.pid or 0) / process_tree.MIB
                if rss_mb > limit_mb:
                    raise self._kill(worker, EpisodeStatus.JUDGE_MEMORY,
                                     f"the judge used {rss_mb:.0f} MB, over judge.memory_limit_mb={limit_mb:g}")
                if time.monotonic() > deadline:
                    raise self._kill(worker, EpisodeStatus.JUDGE_TIMEOUT,
                                     f"the judge ran past judge.timeout={timeout:g}s")
        finally:
            reply.cancel()
        outcome, value = reply.result()
        if outcome == "ok":
            return value
        if outcome == "memory":
            raise self._kill(worker, EpisodeStatus.JUDGE_MEMORY,
                             f"the judge ran out of memory (judge.memory_limit_mb={limit_mb:g}): {value}")
        if outcome == "unreadable":  # the worker read the whole message and waits for the next: still usable
            raise JudgeInputNotSendable(f"the judge's worker process cannot rebuild the judge's input from its "
                                        f"pickle ({value})")
        raise JudgeCallFailed(EpisodeStatus.JUDGE_ERROR, f"the judge raised {value}")

    def _kill(self, worker: _Worker, status: EpisodeStatus, message: str) -> JudgeCallFailed:
        """Kill the worker's tree (unless it died by itself) and say so in the failure."""
        if worker.process.exitcode is not None:
            self._retire(worker)
            return JudgeCallFailed(status, message)
        killed = process_tree.kill_descendants(worker.process.pid or 0)
        self._retire(worker)
        killed_what = f"its worker process and {killed} process(es) it started were" if killed else "its worker process was"
        return JudgeCallFailed(status, f"{message}; {killed_what} killed")

    def _retire(self, worker: _Worker) -> None:
        if worker.alive:
            worker.alive = False
            _end(worker)
            if worker in self._all:  # stop() may have taken the list already
                self._all.remove(worker)

    # -- the pool ------------------------------------------------------------------------------------------
    async def _take(self) -> _Worker:
        """An idle worker, or a new one (the caller holds a slot, so there are never too many)."""
        while self._idle:
            worker = self._idle.pop()
            if worker.alive and worker.process.is_alive():
                return worker
            self._retire(worker)
        return await self._spawn()

    async def _spawn(self) -> _Worker:
        ours, theirs = socket.socketpair()
        process = self._context.Process(target=serve_judge, name="agenttune-judge", daemon=True,
                                        args=(theirs, self.judge_cls, self.options, self.config.memory_limit_mb))
        process.start()
        theirs.close()
        replies: asyncio.Queue = asyncio.Queue()
        pipe = await open_pipe(ours, replies.put_nowait, lambda: None)
        worker = _Worker(process, pipe, replies)
        self._all.append(worker)
        try:
            outcome, value = await asyncio.wait_for(replies.get(), START_TIMEOUT_S)
        except TimeoutError:
            outcome, value = "error", f"it did not start within {START_TIMEOUT_S:g}s"
        if outcome != "ready":
            self._retire(worker)
            raise JudgeCallFailed(EpisodeStatus.JUDGE_ERROR, f"the judge's worker process failed to start: {value}")
        return worker


def _unsendable(judge_input: JudgeInput, error: Exception) -> JudgeInputNotSendable:
    """The input cannot be pickled: name the handed values that cannot."""
    culprits = [f"handed[{key!r}] (a {type(value).__name__})" for key, value in judge_input.handed.items()
                if not _picklable(value)]
    what = ", ".join(culprits) or "the judge's input"
    return JudgeInputNotSendable(f"the judge's input cannot be sent to its worker process: {what} cannot be "
                                 f"pickled ({type(error).__name__}: {error})")


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return True


def _end(worker: _Worker) -> None:
    """Kill a worker's tree (descendants first, while it still adopts their orphans), reap it, free its fds."""
    if worker.process.exitcode is None:  # (an exited worker's pid may already be another process's)
        process_tree.kill_descendants(worker.process.pid or 0)
        worker.process.kill()
        worker.process.join(STOP_TIMEOUT_S)
    worker.pipe.close()
    if worker.process.exitcode is not None:
        worker.process.close()


# -- inside a worker -------------------------------------------------------------------------------------------
def serve_judge(sock: socket.socket, judge_cls: type[Judge], options: Any, memory_limit_mb: float) -> None:
    """A judge worker's main: build the judge, then answer one call at a time until told to stop."""
    process_tree.become_subreaper()  # descendants that leave the session stay ours, to be killed with us
    process_tree.limit_address_space(memory_limit_mb)
    channel = _BlockingPipe(sock)
    try:
        judge = judge_cls(options)
    except Exception as error:
        channel.send(("error", describe(error)))
        return
    channel.send(("ready", None))
    while True:
        try:
            judge_input = channel.receive()
        except _Unreadable as error:  # the input pickled there but does not unpickle here
            reply: tuple[str, Any] = ("unreadable", str(error))
        else:
            if judge_input is None:
                break
            reply = _answer(judge, judge_input)  # sent once the call's frames (and what they hold) are gone
        try:
            channel.send(reply)
        except OSError:  # the parent is gone: nothing to tell
            return
    try:
        _run_to_completion(judge.aclose)
    except Exception:  # noqa: S110 - closing clients at exit: nothing useful to report
        pass


def _answer(judge: Judge, judge_input: Any) -> tuple[str, Any]:
    try:
        return "ok", _run_to_completion(judge.judge, judge_input)
    except MemoryError as error:  # no traceback text: the traceback still holds what filled the memory
        return "memory", f"MemoryError: {error}"
    except BaseException as error:  # SystemExit in a judge is its error, not the worker's end
        return "error", describe(error)


class _Unreadable(Exception):
    """A message arrived whole but does not unpickle in this process."""


class _BlockingPipe:
    """The worker's end of MessagePipe's framing (a 4-byte length, a pickle), read with blocking calls."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, message: Any) -> None:
        try:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            payload = pickle.dumps(("error", f"the judge returned a value that cannot be pickled: {describe(error)}"))
        self.sock.sendall(len(payload).to_bytes(4, "big") + payload)

    def receive(self) -> Any:
        """The next message; None when the other end closed. Raises _Unreadable for one that does not
        unpickle (the stream stays in step: the whole message was read)."""
        header = self._exactly(4)
        if header is None:
            return None
        payload = self._exactly(int.from_bytes(header, "big")) or b"N."
        try:
            return pickle.loads(payload)
        except Exception as error:
            raise _Unreadable(f"{type(error).__name__}: {error}") from None

    def _exactly(self, count: int) -> bytes | None:
        data = bytearray()
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                return None
            data += chunk
        return bytes(data)
