"""Workflows in worker processes (`rollout.workflow_processes: N`): one event loop per core.

Agent code is Python. Every episode of an in-process run shares the trainer's one event loop, so
with a few hundred episodes at once the CPU spent per model call (the agent's client library, an
agent framework, and the gateway's parsing, templating and tokenizing) queues up on one core, and
the loop, not the model, sets the pace. With N worker processes each runs its share of the
episodes with a gateway of its own, on its own event loop: requests are parsed, rendered,
tokenized and filed on the episode's timeline there. Only engine calls (token ids in, token ids
and logprobs out) come to the trainer's process, where the inference engine, the judge and the
rollout's bookkeeping stay. The episode's record (conversation, samples, counters) comes back
with its result, so it is judged, logged and trained exactly as in-process.

In a worker the tuner is the in-process tuner: `as_openai_client()`, `as_async_openai_client()` and
`channel.async_transport()` reach the worker's gateway without a socket, `tuner.base_url` is its
HTTP address (for agent frameworks), `tuner.context_overflow` is its channel's.

What crosses the process boundary: the workflow class, the configs and the tokenizer (once per
worker, so the class must be importable by name: defined at module level); each task; engine
calls and their generations; back come the workflow's return value and what it handed the judge
(pickled), or its error as text, and the record. `tuner.add_cleanup` callbacks run in the worker
after the judge, as in-process (the trainer tells the worker when).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import pickle
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import agenttune.rollout.process_tree as process_tree
from agenttune.components.engines.base import Generation, InferenceEngine, SamplingParams
from agenttune.errors import UserError
from agenttune.gateway.channel import EpisodeRecord
from agenttune.rollout.messages import (
    Abort,
    Cancel,
    Done,
    End,
    Ended,
    Failed,
    Generate,
    GenerateChat,
    Generated,
    Outcome,
    Ready,
    Run,
    Stop,
    ToTrainer,
    ToWorker,
)
from agenttune.rollout.pipe import MessagePipe, open_pipe
from agenttune.rollout.running import WorkflowProcessError, call_workflow, describe, run_until_done
from agenttune.workflow.episode import EnvironmentFailure

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from agenttune.config.models import AgentTuneConfig
    from agenttune.gateway import Gateway
    from agenttune.workflow.base import Workflow
    from agenttune.workflow.tuner import ModelTuner

# A worker imports agenttune, the workflow's module and its agent framework before it says ready.
START_TIMEOUT_S = 120.0
# How long the trainer waits for a worker to run an episode's cleanups (release environments).
CLEANUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
# How long a worker gets to answer that a cancelled workflow has stopped before it is killed.
CANCEL_ANSWER_S = 5.0


class WorkerEpisode:
    """The trainer's side of an episode that runs in a worker (its tuner's `channel` there).

    The record arrives with the workflow's result: empty until then, and if the worker dies.
    """

    def __init__(self, episode_id: str, sampling: SamplingParams):
        self.episode_id = episode_id
        self.sampling = sampling
        self.recorded: EpisodeRecord | str = EpisodeRecord()  # str: why the worker could not read it

    @property
    def engine_failing(self) -> bool:
        return isinstance(self.recorded, EpisodeRecord) and self.recorded.engine_failing

    @property
    def context_overflow(self) -> bool:
        """Whether the worker's gateway refused one of this episode's calls for context overflow."""
        return isinstance(self.recorded, EpisodeRecord) and self.recorded.metrics.get("context_overflow", 0.0) > 0

    @property
    def turn_limit(self) -> bool:
        """Whether the worker's gateway refused one of this episode's calls at `rollout.max_turns`."""
        return isinstance(self.recorded, EpisodeRecord) and self.recorded.metrics.get("turn_limit", 0.0) > 0

    def record(self, trainable_targets: list[str] | None = None) -> EpisodeRecord:
        """The record as the worker read it (with the same `rollout.trainable_targets`)."""
        if isinstance(self.recorded, str):
            raise WorkflowProcessError(self.recorded)
        return self.recorded


@dataclass
class _Setup:
    """What a worker needs to start: it builds its own gateway from these."""

    config: AgentTuneConfig
    gateway_config: AgentTuneConfig
    tokenizer: Any
    wants_messages: bool  # the engine takes messages (chat mode), not prompt ids
    adapter_names: tuple[str, ...]  # the LoRA adapters the engine serves (several policies): the worker routes by them
    http: bool  # the worker's gateway serves HTTP too (when the trainer's does)
    workflow_cls: type[Workflow]
    run_dir: Any


@dataclass
class _Worker:
    process: BaseProcess
    ready: asyncio.Future
    pipe: MessagePipe | None = None
    replies: dict[tuple[type, int], asyncio.Future] = field(default_factory=dict)  # (Done or Ended, job)
    generating: dict[int, asyncio.Task] = field(default_factory=dict)  # its engine calls in flight
    alive: bool = True


class WorkflowProcesses:
    """`count` worker processes that run workflows for the trainer's process.

    `await start()` once (spawns them and waits until each has imported the workflow and started
    its gateway); per episode `open_episode()` and `run(tuner)`; `await stop()` at the end. A
    worker that dies fails the episodes it was running (they are recorded as workflow errors) and
    is replaced at the next episode.
    """

    def __init__(self, count: int, gateway: Gateway, config: AgentTuneConfig, workflow_cls: type[Workflow],
                 run_dir: Any = None):
        self.count = count
        self.engine = gateway.engine
        gateway_config = gateway.config.model_copy(
            update={"gateway": gateway.config.gateway.model_copy(update={"port": 0})})  # each its own free port
        wants_messages = gateway.engine.wants_messages
        self.setup = _Setup(config, gateway_config, gateway.tokenizer, wants_messages, gateway.engine.adapter_names,
                            http=gateway.port is not None,
                            workflow_cls=workflow_cls, run_dir=run_dir)
        self._workers: list[_Worker] = []
        self._replacing = asyncio.Lock()  # one replacement per dead worker, ready before it gets work
        self._job_ids = itertools.count()
        self._context = multiprocessing.get_context("spawn")  # fork would copy the trainer's threads and CUDA

    async def start(self) -> WorkflowProcesses:
        _check_picklable(self.setup.workflow_cls)
        self._workers = [await self._spawn() for _ in range(self.count)]
        await asyncio.gather(*(self._until_ready(worker) for worker in self._workers))
        return self

    async def stop(self) -> None:
        workers, self._workers = self._workers, []
        for worker in workers:
            if worker.process.exitcode is None:  # first what its workflows left running (it adopted orphans)
                process_tree.kill_descendants(worker.process.pid or 0)
            self._retire(worker, "the workflow processes were stopped")
            if worker.process.is_alive():
                await asyncio.to_thread(worker.process.join, STOP_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                await asyncio.to_thread(worker.process.join, STOP_TIMEOUT_S)

    def open_episode(self, episode_id: str, sampling: SamplingParams) -> WorkerEpisode:
        return WorkerEpisode(episode_id, sampling)

    def close_episode(self, episode: WorkerEpisode) -> None:
        """Nothing to do: the worker closes the episode's channel when the workflow ends."""

    async def run(self, tuner: ModelTuner) -> Any:
        """Run the workflow for `tuner`'s episode in a worker; its return value.

        Raises WorkflowProcessError when it fails there. Cancelling this cancels the workflow in the
        worker and waits for it to unwind (the rollout engine bounds that wait). Either way the
        episode's record is on `tuner.channel` afterwards. The worker runs the episode's cleanups
        when the trainer runs `tuner.run_cleanups()`.
        """
        worker = await self._least_busy()
        job = next(self._job_ids)
        done = self._expect(worker, Done, job)
        episode: WorkerEpisode = tuner.channel  # type: ignore[assignment]
        try:
            self._send(worker, Run(job, tuner.task, episode.episode_id, episode.sampling))
        except Exception:  # the task cannot be pickled: this episode's error
            worker.replies.pop((Done, job), None)
            raise
        try:
            reply: Done = await asyncio.shield(done)
        except asyncio.CancelledError:
            tuner.add_cleanup(lambda: self._end(worker, job))  # whatever it registered before it stopped
            self._send(worker, Cancel(job))
            # The worker answers once the workflow has unwound; one whose event loop a workflow blocks
            # never does: it is killed (with what it started), its other episodes fail, a new one starts.
            finished, _ = await asyncio.wait({done}, timeout=CANCEL_ANSWER_S)
            if not finished:
                self._kill(worker, f"its event loop was blocked: a cancelled workflow did not stop within "
                                   f"{CANCEL_ANSWER_S:g} s, so the process was killed")
            episode.recorded = done.result().record or episode.recorded
            raise
        if reply.cleanups:  # the worker keeps the episode's tuner until told to run them
            tuner.add_cleanup(lambda: self._end(worker, job))
        tuner.judge_input_dictionary.update(reply.handed)
        episode.recorded = reply.record or episode.recorded
        if reply.outcome == "ok":
            return reply.value
        if reply.outcome == "cancelled":
            raise asyncio.CancelledError
        raise WorkflowProcessError(reply.value, environment=reply.outcome == "environment_error")

    # -- the workers --------------------------------------------------------------------------------
    async def _spawn(self) -> _Worker:
        ours, theirs = socket.socketpair()
        process = self._context.Process(target=serve_worker, args=(theirs, self.setup), name="agenttune-workflows",
                                        daemon=True)
        process.start()
        theirs.close()
        worker = _Worker(process, asyncio.get_running_loop().create_future())
        worker.pipe = await open_pipe(ours, lambda message: self._receive(worker, message),
                                      lambda: self._exited(worker))
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
        async with self._replacing:
            for index, worker in enumerate(self._workers):
                if not worker.alive:  # replace a dead worker before handing out work
                    replacement = await self._spawn()
                    await self._until_ready(replacement)
                    self._workers[index] = replacement
        return min(self._workers, key=lambda worker: len(worker.replies))

    def _receive(self, worker: _Worker, message: ToTrainer) -> None:
        """A message from a worker (called by the event loop as it arrives)."""
        match message:
            case Generate() | GenerateChat():  # an engine call of one of its episodes
                worker.generating[message.call] = asyncio.create_task(self._generate(worker, message))
            case Abort(call):  # the episode stopped waiting (cancelled, timed out)
                running = worker.generating.pop(call, None)
                if running is not None:
                    running.cancel()
            case Ready():
                worker.ready.set_result(None)
            case Failed(reason):  # it could not even start: the workflow's module did not import
                worker.ready.set_exception(UserError(
                    f"A workflow process could not start: {reason}",
                    hint="The workflow must be importable by name (module:Class at module level) in a fresh "
                         "process; set rollout.workflow_processes: 1 to run it in this process instead."))
            case Done(job) | Ended(job):
                reply = worker.replies.pop((type(message), job), None)
                if reply is not None and not reply.done():
                    reply.set_result(message)

    async def _generate(self, worker: _Worker, request: Generate | GenerateChat) -> None:
        result: Generation | tuple[Generation, list[int] | None] | None
        try:
            if isinstance(request, Generate):
                result = await self.engine.generate(request.prompt_ids, request.sampling,
                                                    request_id=request.request_id)
            else:
                result = await self.engine.generate_chat(request.messages, request.tools, request.sampling)
            error = None
        except asyncio.CancelledError:
            return  # the worker gave up on it (abort), or the worker is gone
        except Exception as raised:  # the worker's gateway turns it into the episode's 502, as in-process
            result, error = None, _sendable(raised)
        finally:
            worker.generating.pop(request.call, None)
        self._send(worker, Generated(request.call, result, error))

    def _exited(self, worker: _Worker) -> None:
        """The worker's end of the pipe closed: it exited (or crashed)."""
        if not worker.alive:  # retired on purpose (stop, or unreachable): nothing to report
            return
        worker.process.join(0.1)  # reaped, so its exit code can be told
        during = " while running this episode" if worker.ready.done() else ""
        self._retire(worker, f"the workflow process exited (exit code {worker.process.exitcode}){during}")

    def _kill(self, worker: _Worker, reason: str) -> None:
        """Retire `worker` and kill its process tree (it cannot be asked to stop)."""
        self._retire(worker, reason)
        process_tree.kill_descendants(worker.process.pid or 0)
        worker.process.kill()

    def _retire(self, worker: _Worker, reason: str) -> None:
        """Stop talking to `worker`, tell it to stop, and fail whatever it was still running."""
        if not worker.alive:
            return
        worker.alive = False
        if worker.pipe is not None:
            try:
                worker.pipe.send(Stop())
            except OSError:
                pass  # it is gone already
            worker.pipe.close()
        if not worker.ready.done():
            worker.ready.set_exception(UserError(f"A workflow process could not start: {reason}.",
                                                 hint="Set rollout.workflow_processes: 1 to run workflows in "
                                                      "this process and see why."))
        replies, worker.replies = worker.replies, {}
        for (_, job), reply in replies.items():  # an End awaiting Ended gets a Done too: it only waits
            if not reply.done():
                reply.set_result(Done(job, "error", reason, {}, None, False))
        for running in worker.generating.values():
            running.cancel()

    def _expect(self, worker: _Worker, kind: type[Done | Ended], job: int) -> asyncio.Future:
        worker.replies[kind, job] = reply = asyncio.get_running_loop().create_future()
        return reply

    def _send(self, worker: _Worker, message: ToWorker) -> None:
        if not worker.alive or worker.pipe is None:
            return  # its replies were failed when it was retired
        try:
            worker.pipe.send(message)
        except OSError:
            self._retire(worker, "the workflow process could not be reached")

    async def _end(self, worker: _Worker, job: int) -> None:
        """Run the episode's cleanups in its worker (an `add_cleanup` callback of the trainer's tuner)."""
        if not worker.alive:
            return
        ended = self._expect(worker, Ended, job)
        self._send(worker, End(job))
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


def _sendable(error: Exception) -> Exception:
    """`error` itself if it survives pickling (its type name is part of the episode's 502), else its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


# -- inside a worker ------------------------------------------------------------------------------------
class RemoteEngine(InferenceEngine):
    """The trainer's inference engine, as the worker's gateway sees it: each call goes over the pipe."""

    name = "workflow-process"

    def __init__(self, wants_messages: bool, adapters: tuple[str, ...] = ()):
        self.wants_messages = wants_messages
        self._adapters = adapters
        self.pipe: MessagePipe | None = None
        self._calls = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The trainer's engine's: the worker's gateway routes each agent to its policy's adapter, whose
        name travels to that engine in the call's SamplingParams."""
        return self._adapters

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        return await self._call(lambda call: Generate(call, prompt_ids, sampling, request_id))

    async def generate_chat(self, messages: list[dict], tools: list[dict] | None,
                            sampling: SamplingParams) -> tuple[Generation, list[int] | None]:
        return await self._call(lambda call: GenerateChat(call, messages, tools, sampling))

    async def _call(self, request: Callable[[int], Generate | GenerateChat]) -> Any:
        """Send `request(call)` with a fresh call number; the result of the Generated that answers it."""
        if self.pipe is None:
            raise ConnectionError("the trainer's process is gone")
        call = next(self._calls)
        self._waiting[call] = waiting = asyncio.get_running_loop().create_future()
        try:
            self.pipe.send(request(call))
            answer: Generated = await waiting
        except asyncio.CancelledError:
            if self._waiting.pop(call, None) is not None and self.pipe is not None:
                self.pipe.send(Abort(call))
            raise
        if answer.error is not None:
            raise answer.error
        return answer.result

    def answer(self, answer: Generated) -> None:
        waiting = self._waiting.pop(answer.call, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    def disconnect(self) -> None:
        self.pipe = None
        waiting, self._waiting = self._waiting, {}
        for call, answer in waiting.items():
            if not answer.done():
                answer.set_result(Generated(call, None, ConnectionError("the trainer's process is gone")))


def serve_worker(sock: socket.socket, setup: _Setup) -> None:
    """A worker process's main: run episodes as the trainer sends them, until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the trainer decides
    process_tree.become_subreaper()  # what workflows start stays in this tree, to end with it
    # run_until_done: a workflow that swallows cancellation cannot keep the worker from exiting
    run_until_done(_Episodes(sock, setup).serve())


class _Episodes:
    """A worker's episodes: its gateway, and the workflows the trainer has it run."""

    def __init__(self, sock: socket.socket, setup: _Setup):
        from agenttune.rollout.framework_loader import FrameworkLoader

        self.sock = sock
        self.setup = setup
        self.engine = RemoteEngine(setup.wants_messages, setup.adapter_names)
        self.frameworks = FrameworkLoader(setup.run_dir)
        self.gateway: Gateway | None = None
        self.runs: dict[int, asyncio.Task] = {}
        self.tuners: dict[int, ModelTuner] = {}
        self.stopped: asyncio.Future | None = None

    async def serve(self) -> None:
        from agenttune.gateway import Gateway
        from agenttune.rollout.gc import rollout_gc

        loop = asyncio.get_running_loop()
        self.stopped = loop.create_future()
        failure = None
        try:  # before the pipe opens: nothing reaches the episodes until the gateway is up
            self.frameworks.get(self.setup.config.agent_framework)  # its setup() runs before the first episode
            self.gateway = Gateway(self.engine, self.setup.tokenizer, self.setup.gateway_config)
            if self.setup.http:
                await self.gateway.start()
            else:
                self.gateway.loop = loop
        except Exception as error:
            failure = f"{type(error).__name__}: {error}"
        pipe = self.engine.pipe = await open_pipe(self.sock, self._receive, self._stop)
        if failure is not None or self.gateway is None:
            pipe.send(Failed(str(failure)))
            pipe.close()
            return
        pipe.send(Ready())
        try:
            with rollout_gc():  # what is still running at the end, run_until_done cancels
                await self.stopped
        finally:
            await self.gateway.stop()
            pipe.close()

    def _receive(self, message: ToWorker) -> None:
        match message:
            case Generated():
                self.engine.answer(message)
            case Run(job):
                self.runs[job] = asyncio.create_task(self._run(message))
            case Cancel(job) if job in self.runs:
                self.runs[job].cancel()
            case End(job):
                asyncio.create_task(self._end(job))
            case Stop():  # the trainer is done with this worker
                self._stop()

    def _stop(self) -> None:
        self.engine.disconnect()
        if self.stopped is not None and not self.stopped.done():
            self.stopped.set_result(None)

    async def _run(self, run: Run) -> None:
        from agenttune.workflow.tuner import ModelTuner, call_logged

        assert self.gateway is not None
        job = run.job
        channel = self.gateway.open_episode(run.episode_id, run.sampling)
        tuner = self.tuners[job] = ModelTuner(channel, run.task, self.setup.config, self.frameworks)
        outcome: Outcome
        try:
            outcome, value = "ok", await call_workflow(self.setup.workflow_cls, run.task, tuner)
        except asyncio.CancelledError:
            outcome, value = "cancelled", None
        except EnvironmentFailure as error:  # the trainer names the episode's status after it
            outcome, value = "environment_error", describe(error)
        except Exception as error:
            outcome, value = "error", describe(error)
        finally:
            self.runs.pop(job, None)
        try:  # also after a failure: a partial conversation is what the log viewer must show
            record: EpisodeRecord | str = channel.record(trainable_targets=self.setup.config.rollout.trainable_targets)
        except Exception as error:
            record = describe(error)
        await call_logged(tuner.aclose, "closing the episode's clients")
        self.gateway.close_episode(channel)
        if not tuner.has_cleanups:
            self.tuners.pop(job, None)
        self._reply(Done(job, outcome, value, dict(tuner.judge_input_dictionary), record, tuner.has_cleanups))

    async def _end(self, job: int) -> None:
        tuner = self.tuners.pop(job, None)
        if tuner is not None:
            await tuner.run_cleanups()
        self._reply(Ended(job))

    def _reply(self, message: Done | Ended) -> None:
        pipe = self.engine.pipe
        if pipe is None:
            return  # the trainer is gone; serve() is ending
        try:
            pipe.send(message)
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # pickling happens before writing
            assert isinstance(message, Done)  # only a Done carries the workflow's values
            pipe.send(replace(message, outcome="error", handed={},
                              value=f"the workflow's result (or what it handed the judge) cannot be sent back "
                                    f"from the workflow process: {type(error).__name__}: {error}"))
        except OSError:
            pass  # the trainer is gone
