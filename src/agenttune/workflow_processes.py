"""Workflows in worker processes (`rollout.workflow_processes: N`): one event loop per core.

Agent code is Python. Every episode of an in-process run shares the trainer's one event loop, so
with a few hundred episodes at once the CPU the agents spend per model call (their client library,
an agent framework, prompt building) and the gateway's own work queue up on one core, and the loop,
not the model, sets the pace. With N worker processes each runs its share of the episodes on its
own event loop; the gateway, the engine, the judge and the episode record stay in the trainer's
process, exactly as in-process.

The tuner's own clients (`as_openai_client`, `as_async_openai_client`, `channel.async_transport()`)
use the in-process transports as in the trainer; their handler here is the worker's pipe to the
trainer's gateway: no HTTP on either side (over loopback HTTP a call cost ~3.5x the CPU). Clients built from
`tuner.base_url` (agent frameworks) use the gateway's HTTP server, which works as well.

What crosses the process boundary: the workflow class and the config (once per worker, so the
class must be importable by name: defined at module level), each task and episode key; back come
the workflow's return value, what it handed the judge, or its error as text. `tuner.add_cleanup`
callbacks run in the worker after the judge, as in-process (the trainer tells the worker when).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import multiprocessing
import pickle
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from agenttune.errors import UserError
from agenttune.gateway.channel import EpisodeAddress

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from agenttune.config import AgentTuneConfig
    from agenttune.gateway import Gateway
    from agenttune.gateway.server import Reply
    from agenttune.task import Task
    from agenttune.tuner import ModelTuner
    from agenttune.workflow import Workflow

# A worker imports agenttune, the workflow's module and its agent framework before it says ready.
START_TIMEOUT_S = 120.0
# How long the trainer waits for a worker to run an episode's cleanups (release environments).
CLEANUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0


class WorkflowProcessError(Exception):
    """The workflow failed in a worker process; `description` is its error and traceback there."""

    def __init__(self, description: str):
        super().__init__(description.splitlines()[0] if description else "the workflow failed")
        self.description = description


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    ready: asyncio.Future
    replies: dict[tuple[str, int], asyncio.Future] = field(default_factory=dict)  # ("done"/"ended", job)
    alive: bool = True


class WorkflowProcesses:
    """`count` worker processes that run workflows for the trainer's process.

    `await start()` once (spawns them and waits until each has imported the workflow), `run(tuner)`
    per episode, `await stop()` at the end. A worker that dies fails the episodes it was running
    (they are recorded as workflow errors) and is replaced at the next episode.
    """

    def __init__(self, count: int, gateway: Gateway, config: AgentTuneConfig, workflow_cls: type[Workflow],
                 run_dir: Any = None):
        self.count = count
        self.gateway = gateway
        self.config = config
        self.workflow_cls = workflow_cls
        self.run_dir = run_dir
        self._workers: list[_Worker] = []
        self._job_ids = itertools.count()
        self._context = multiprocessing.get_context("spawn")  # fork would copy the trainer's threads and CUDA

    async def start(self) -> WorkflowProcesses:
        _check_picklable(self.workflow_cls)
        self._workers = [self._spawn() for _ in range(self.count)]
        await asyncio.gather(*(self._until_ready(worker) for worker in self._workers))
        return self

    async def stop(self) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            self._retire(worker, "the workflow processes were stopped")
            if worker.process.is_alive():
                await asyncio.to_thread(worker.process.join, STOP_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                await asyncio.to_thread(worker.process.join, STOP_TIMEOUT_S)

    async def run(self, tuner: ModelTuner) -> Any:
        """Run the workflow for `tuner`'s episode in a worker; its return value.

        Raises WorkflowProcessError when it fails there. Cancelling this cancels the workflow in the
        worker and waits for it to unwind (the rollout engine bounds that wait). The worker runs the
        episode's cleanups when the trainer runs `tuner.run_cleanups()`.
        """
        worker = await self._least_busy()
        job = next(self._job_ids)
        done = self._expect(worker, "done", job)
        channel = tuner.channel
        tuner.add_cleanup(lambda: self._end(worker, job))
        self._send(worker, ("run", job, tuner.task, self.gateway.root_url, channel.key, channel.episode_id))
        try:
            outcome, value, handed = await asyncio.shield(done)
        except asyncio.CancelledError:
            self._send(worker, ("cancel", job))
            await asyncio.wait({done})  # the worker answers "cancelled" once the workflow has unwound
            raise
        tuner.judge_input_dictionary.update(handed)
        if outcome == "ok":
            return value
        if outcome == "cancelled":
            raise asyncio.CancelledError
        raise WorkflowProcessError(value)

    # -- the workers --------------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=serve_worker, args=(theirs, self.config, self.workflow_cls,
                                                                   self.run_dir),
                                        name="agenttune-workflows", daemon=True)
        process.start()
        theirs.close()
        loop = asyncio.get_running_loop()
        worker = _Worker(process, ours, loop.create_future())
        loop.add_reader(ours.fileno(), self._receive, worker)
        return worker

    async def _until_ready(self, worker: _Worker) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(worker.ready), START_TIMEOUT_S)
        except TimeoutError:
            self._retire(worker, "it did not start")
            raise UserError(f"A workflow process did not start within {START_TIMEOUT_S:g} s.",
                            hint="Set rollout.workflow_processes: 1 to run workflows in this process and see "
                                 "why (a slow or hanging import in the workflow's module?).") from None

    async def _least_busy(self) -> _Worker:
        for index, worker in enumerate(self._workers):
            if not worker.alive:  # replace a dead worker before handing out work
                self._workers[index] = replacement = self._spawn()
                await self._until_ready(replacement)
        return min(self._workers, key=lambda worker: len(worker.replies))

    def _receive(self, worker: _Worker) -> None:
        """Read what a worker sent (called by the event loop when its pipe is readable)."""
        try:
            while worker.conn.poll():
                kind, *rest = worker.conn.recv()
                if kind == "request":  # a call of one of its episodes, for the gateway
                    asyncio.create_task(self._answer(worker, *rest))
                elif kind == "ready":
                    worker.ready.set_result(None)
                elif kind == "failed":  # it could not even start: the workflow's module did not import
                    worker.ready.set_exception(UserError(
                        f"A workflow process could not start: {rest[0]}",
                        hint="The workflow must be importable by name (module:Class at module level) in a fresh "
                             "process; set rollout.workflow_processes: 1 to run it in this process instead."))
                else:  # "done" (job, outcome, value, handed) or "ended" (job,)
                    reply = worker.replies.pop((kind, rest[0]), None)
                    if reply is not None and not reply.done():
                        reply.set_result(tuple(rest[1:]))
        except (EOFError, OSError):
            worker.process.join(0.1)
            self._retire(worker, f"the workflow process exited (exit code {worker.process.exitcode}) while "
                                 "running this episode")

    async def _answer(self, worker: _Worker, request: int, method: str, path: str, headers: dict, body: bytes) -> None:
        self._send(worker, ("reply", request, await self.gateway.handle(method, path, headers, body)))

    def _retire(self, worker: _Worker, reason: str) -> None:
        """Stop reading from `worker`, tell it to stop, and fail whatever it was still running."""
        if not worker.alive:
            return
        worker.alive = False
        asyncio.get_running_loop().remove_reader(worker.conn.fileno())
        try:
            worker.conn.send(None)
        except OSError:
            pass  # it is gone already
        worker.conn.close()
        if not worker.ready.done():
            worker.ready.set_exception(UserError(f"A workflow process could not start: {reason}.",
                                                 hint="Set rollout.workflow_processes: 1 to run workflows in "
                                                      "this process and see why."))
        replies, worker.replies = worker.replies, {}
        for reply in replies.values():
            if not reply.done():
                reply.set_result(("error", reason, {}))

    def _expect(self, worker: _Worker, kind: str, job: int) -> asyncio.Future:
        worker.replies[kind, job] = reply = asyncio.get_running_loop().create_future()
        return reply

    def _send(self, worker: _Worker, message: tuple) -> None:
        if not worker.alive:
            return  # its replies were failed when it was retired
        try:
            worker.conn.send(message)
        except OSError:
            self._retire(worker, "the workflow process could not be reached")

    async def _end(self, worker: _Worker, job: int) -> None:
        """Run the episode's cleanups in its worker (an `add_cleanup` callback of the trainer's tuner)."""
        if not worker.alive:
            return
        ended = self._expect(worker, "ended", job)
        self._send(worker, ("end", job))
        try:
            await asyncio.wait_for(ended, CLEANUP_TIMEOUT_S)
        except TimeoutError:
            raise RuntimeError(f"the workflow process did not finish the episode's cleanups within "
                               f"{CLEANUP_TIMEOUT_S:g} s") from None


def _check_picklable(workflow_cls: type) -> None:
    try:
        pickle.dumps(workflow_cls)
    except Exception as error:
        raise UserError(
            f"rollout.workflow_processes needs a workflow class that can be imported by name in another "
            f"process, and {workflow_cls.__module__}.{workflow_cls.__qualname__} cannot ({error}).",
            hint="Define the workflow at the top level of a module and name it as `module:Class`, or set "
                 "rollout.workflow_processes: 1.") from None


# -- inside a worker ------------------------------------------------------------------------------------
class ProcessChannel(EpisodeAddress):
    """A worker's view of an episode's gateway channel: the same address, key and transports.

    Its transports hand requests over the worker's pipe to the trainer's gateway (`handler` is the
    worker's `_Episodes`). The record of the episode (timelines, samples, counters) stays in the
    trainer's process; of it, a workflow can read `context_overflow`, which this asks the gateway for.
    """

    def __init__(self, root_url: str, key: str, episode_id: str, handler: _Episodes):
        self._root_url = root_url
        self.key = key
        self.episode_id = episode_id
        self.handler = handler

    @property
    def root_url(self) -> str:
        return self._root_url

    @property
    def context_overflow(self) -> bool:
        # Over HTTP: a property is sync, and the pipe is served by this worker's event loop.
        response = httpx.get(f"{self.base_url}/episode", headers={"authorization": f"Bearer {self.key}"},
                             verify=_tls_context())
        return bool(response.json().get("context_overflow"))


@functools.cache
def _tls_context() -> Any:
    """One TLS context per process: httpx builds one per client otherwise (~30 ms: certifi's bundle)."""
    return httpx.create_ssl_context()


def serve_worker(conn: Connection, config: AgentTuneConfig, workflow_cls: type[Workflow], run_dir: Any) -> None:
    """A worker process's main: run episodes as the trainer sends them, until told to stop."""
    from agenttune.session import run_until_done

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the trainer decides
    # run_until_done: a workflow that swallows cancellation cannot keep the worker from exiting
    run_until_done(_Episodes(conn, config, workflow_cls, run_dir).serve())


class _Episodes:
    def __init__(self, conn: Connection, config: AgentTuneConfig, workflow_cls: type[Workflow], run_dir: Any):
        from agenttune.tuner import FrameworkLoader

        self.conn = conn
        self.config = config
        self.workflow_cls = workflow_cls
        self.frameworks = FrameworkLoader(run_dir)
        self.runs: dict[int, asyncio.Task] = {}
        self.tuners: dict[int, ModelTuner] = {}
        self.replies: dict[int, asyncio.Future] = {}  # forwarded requests awaiting the gateway's answer
        self.request_ids = itertools.count()
        self.loop: asyncio.AbstractEventLoop | None = None  # the in-process transports send from this loop

    async def serve(self) -> None:
        from agenttune.rollout_gc import rollout_gc

        try:
            self.frameworks.get(self.config.agent_framework)  # its setup() runs before the first episode
        except Exception as error:
            self.conn.send(("failed", f"{type(error).__name__}: {error}"))
            return
        inbox: asyncio.Queue = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.conn.fileno(), self._read, inbox)
        self.conn.send(("ready",))
        with rollout_gc():  # what is still running at the end, run_until_done cancels
            while (message := await inbox.get()) is not None:
                kind, job, *rest = message
                if kind == "run":
                    self.runs[job] = asyncio.create_task(self._run(job, *rest))
                elif kind == "cancel" and job in self.runs:
                    self.runs[job].cancel()
                elif kind == "end":
                    asyncio.create_task(self._end(job))

    def _read(self, inbox: asyncio.Queue) -> None:
        try:
            while self.conn.poll():
                message = self.conn.recv()
                if message is not None and message[0] == "reply":
                    reply = self.replies.pop(message[1], None)
                    if reply is not None and not reply.done():
                        reply.set_result(message[2])
                else:
                    inbox.put_nowait(message)
        except (EOFError, OSError):  # the trainer is gone
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
            inbox.put_nowait(None)

    async def handle(self, method: str, path: str, headers: Any, body: bytes) -> Reply:
        """Have the trainer's gateway answer a request (what the in-process transports call)."""
        request = next(self.request_ids)
        reply = self.replies[request] = asyncio.get_running_loop().create_future()
        try:
            self.conn.send(("request", request, method, path, dict(headers), body))
        except OSError:
            self.replies.pop(request, None)
            raise httpx.ConnectError("the trainer's process is gone") from None
        return await reply

    async def _run(self, job: int, task: Task, root_url: str, key: str, episode_id: str) -> None:
        from agenttune.rollout import call_logged, call_workflow, describe
        from agenttune.tuner import ModelTuner

        channel = ProcessChannel(root_url, key, episode_id, self)
        tuner = self.tuners[job] = ModelTuner(channel, task, self.config, self.frameworks)
        try:
            outcome = ("ok", await call_workflow(self.workflow_cls, task, tuner))
        except asyncio.CancelledError:
            outcome = ("cancelled", None)
        except Exception as error:
            outcome = ("error", describe(error))
        finally:
            self.runs.pop(job, None)
            await call_logged(tuner.aclose, "closing the episode's clients")
        self._reply("done", job, *outcome, dict(tuner.judge_input_dictionary))

    async def _end(self, job: int) -> None:
        tuner = self.tuners.pop(job, None)
        if tuner is not None:
            await tuner.run_cleanups()
        self._reply("ended", job)

    def _reply(self, *message: Any) -> None:
        try:
            self.conn.send(message)
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # pickling happens before writing
            kind, job = message[0], message[1]
            self.conn.send((kind, job, "error", f"the workflow's result (or what it handed the judge) cannot be sent "
                                                f"back from the workflow process: {type(error).__name__}: {error}", {}))
        except OSError:
            pass  # the trainer is gone; serve() ends at the pipe's EOF
