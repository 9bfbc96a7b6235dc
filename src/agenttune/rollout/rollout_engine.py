"""The rollout engine: run every task as a group of episodes, isolate failures, judge each episode.

One episode = one fresh `Workflow` instance running one task with its own `ModelTuner` (its own
gateway channel), under `rollout.episode_timeout`, then the judge under `judge.timeout` (in a
worker process by default: judging.py). Whatever
goes wrong inside an episode (the workflow raises, hangs, returns garbage or is cancelled; the
judge raises or hangs) is recorded on that episode as a status and an error message; the batch
always completes. Only cancelling `run_tasks` itself stops it (closing every channel on the way).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agenttune.components.engines.base import SamplingParams
from agenttune.components.judges.base import Judge, JudgeInput, JudgeResult
from agenttune.config.run import get_logger
from agenttune.rollout.framework_loader import FrameworkLoader
from agenttune.rollout.gc import rollout_gc
from agenttune.rollout.judging import (
    PICKLED_COPY,
    JudgeCallFailed,
    JudgeInputNotSendable,
    JudgeProcesses,
    call_judge,
    isolation_of,
)
from agenttune.rollout.loop_watchdog import LoopBlocked, LoopWatchdog
from agenttune.rollout.running import WorkflowProcessError, call_workflow, describe
from agenttune.rollout.workers import WorkflowProcesses
from agenttune.workflow.base import Workflow, WorkflowOutput
from agenttune.workflow.episode import EnvironmentFailure, Episode, EpisodeStatus
from agenttune.workflow.task import Task
from agenttune.workflow.tuner import ModelTuner, call_logged

if TYPE_CHECKING:
    from agenttune.config.models import AgentTuneConfig, RolloutConfig

log = get_logger("rollout")

# How long a cancelled workflow gets to unwind (close clients, release environments) before it is
# abandoned. A workflow that swallows cancellation cannot hold the batch hostage.
CANCEL_GRACE_S = 5.0


class GatewayLimitEnd(WorkflowOutput):
    """What a workflow "returned" when it raised after the gateway refused a call at a limit
    (context overflow, turn limit): the episode ended there, it did not crash."""

    status: EpisodeStatus = EpisodeStatus.CONTEXT_OVERFLOW
    error: str = ""


class EpisodeFailure(Exception):
    """Ends an episode early with a status; the message becomes `Episode.error`."""

    def __init__(self, status: EpisodeStatus, message: str):
        super().__init__(message)
        self.status = status


def sampling_params(rollout: RolloutConfig, *, validation: bool = False) -> SamplingParams:
    """The sampling parameters of training (or validation) rollouts."""
    return SamplingParams(
        temperature=rollout.val_temperature if validation else rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_tokens=rollout.max_response_length_in_one_turn,
    )


class RolloutEngine:
    """Runs workflows on tasks through a gateway and returns judged episodes.

    `gateway` is anything with `open_episode(episode_id, sampling)` / `close_episode(channel)`
    (agenttune.gateway.Gateway). `max_parallel` defaults to `rollout.max_env_worker`.
    `on_episode(episode)` is called as each episode finishes (progress displays).
    """

    def __init__(
        self,
        config: AgentTuneConfig,
        gateway: Any,
        workflow_cls: type[Workflow],
        judge: Judge | None = None,
        *,
        frameworks: FrameworkLoader | None = None,
        max_parallel: int | None = None,
        on_episode: Callable[[Episode], None] | None = None,
    ):
        self.config = config
        self.gateway = gateway
        self.workflow_cls = workflow_cls
        self.judge = judge
        self.frameworks = frameworks or FrameworkLoader()
        self.max_parallel = max_parallel or config.rollout.max_env_worker
        self.on_episode = on_episode
        self._processes: WorkflowProcesses | None = None  # rollout.workflow_processes > 1: started at first use
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._starting: asyncio.Lock | None = None
        self._judge_isolation = isolation_of(judge, config.judge) if judge is not None else "loop"
        self._judge_processes = JudgeProcesses(judge, config.judge) if (
            judge is not None and self._judge_isolation == "process") else None
        self._warned_unsendable = False
        # Workflows in this process: one that blocks the event loop is interrupted at its deadline.
        self._loop_watchdog = LoopWatchdog()

    async def aclose(self) -> None:
        """Stop the workflow and judge processes, if any (rollout_session does this at the end of a run)."""
        self._loop_watchdog.stop()
        processes, self._processes = self._processes, None
        if processes is not None:
            await processes.stop()
        if self._judge_processes is not None:
            await self._judge_processes.stop()

    async def __aenter__(self) -> RolloutEngine:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def run_tasks(
        self,
        tasks: Sequence[Task],
        num_repeat: int | None = None,
        sampling: SamplingParams | None = None,
        *,
        priority: int | None = None,
    ) -> list[Episode]:
        """Run each task `num_repeat` times (one group per task); episodes come back in task order.
        `priority`: the requests' place when they wait for the engine (`SamplingParams.priority`)."""
        num_repeat = num_repeat or self.config.rollout.num_repeat
        sampling = sampling or sampling_params(self.config.rollout)
        if priority is not None:
            sampling = replace(sampling, priority=priority)
        slots = self._episode_slots()
        batch = secrets.token_hex(3)  # group ids stay unique across steps and repeated task ids
        await self._start_pools(len(tasks) * num_repeat)

        async def in_slot(task: Task, group_id: str, repeat_index: int) -> Episode:
            async with slots:
                return await self.run_episode(task, sampling, group_id=group_id, repeat_index=repeat_index)

        with rollout_gc():  # collection pauses would stall every episode on the event loop
            async with asyncio.TaskGroup() as group:
                jobs = [
                    group.create_task(in_slot(task, f"{batch}-{index}", repeat))
                    for index, task in enumerate(tasks)
                    for repeat in range(num_repeat)
                ]
        return [job.result() for job in jobs]

    def _episode_slots(self) -> asyncio.Semaphore:
        """One limit for all batches running at once (asynchronous training runs one per group):
        `max_parallel` episodes in flight in all."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_parallel))
        return self._slots[1]

    async def _start_pools(self, episodes: int) -> None:
        """The workflow and judge processes, started before a batch's first episode. One batch at a
        time: asynchronous training starts a batch per group, dozens at once, and each would otherwise
        find no pool started yet and spawn one of its own (hundreds of processes on the first step)."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            await self._start_processes()
            if self._processes is None:
                self._loop_watchdog.start()
            if self._judge_processes is not None:
                await self._judge_processes.start(episodes)

    async def _start_processes(self) -> None:
        count = self.config.rollout.workflow_processes
        if count <= 1 or self._processes is not None:
            return
        processes = WorkflowProcesses(count, self.gateway, self.config, self.workflow_cls,
                                      self.frameworks.run_dir)
        try:
            self._processes = await processes.start()
        except BaseException:
            await processes.stop()
            raise

    async def run_episode(self, task: Task, sampling: SamplingParams, *, group_id: str,
                          repeat_index: int = 0) -> Episode:
        """One episode, start to judged end. Never raises, except when cancelled from outside."""
        episode = Episode(episode_id=f"{group_id}-{repeat_index}", task=task, group_id=group_id,
                          repeat_index=repeat_index, started_at=time.time())
        started = time.perf_counter()
        tuner: ModelTuner | None = None
        try:
            tuner = ModelTuner(self._open_channel(episode, sampling), task, self.config, self.frameworks)
            output, madness = await self._roll_out(episode, tuner)
            episode.metrics["workflow_s"] = time.perf_counter() - started
            if isinstance(output, GatewayLimitEnd):
                episode.status, episode.error = output.status, output.error
            await self._score(episode, output, dict(tuner.judge_input_dictionary))
            self._apply_madness(episode, madness)
        except EpisodeFailure as failure:
            episode.status, episode.error = failure.status, str(failure)
        finally:  # after the judge, and also when cancelled: environment instances must be released
            if tuner is not None:
                await tuner.run_cleanups()
        episode.duration_s = time.perf_counter() - started
        if episode.status.failed:
            log.warning("episode failed", episode=episode.episode_id, task=task.task_id,
                        status=episode.status.value, error=(episode.error or "").splitlines()[0][:200])
        if self.on_episode is not None:
            self.on_episode(episode)
        return episode

    # -- the workflow ------------------------------------------------------------------------------
    @property
    def _episodes(self) -> Any:
        """Where episodes open: the gateway, or the workflow processes (each has its own gateway)."""
        return self._processes or self.gateway

    def _open_channel(self, episode: Episode, sampling: SamplingParams) -> Any:
        try:
            return self._episodes.open_episode(episode.episode_id, sampling)
        except Exception as error:
            raise EpisodeFailure(EpisodeStatus.ENGINE_ERROR, f"the gateway could not open the episode: "
                                 f"{describe(error)}") from error

    async def _roll_out(self, episode: Episode, tuner: ModelTuner) -> tuple[WorkflowOutput, list[str]]:
        """Run the workflow, collect the channel's record whatever happened, and close the channel.

        Returns the workflow's output and the madness checks that fired.
        """
        channel, episodes = tuner.channel, self._episodes
        outcome: WorkflowOutput | EpisodeFailure
        madness: list[str] = []
        try:
            try:
                outcome = await self._execute(episode, tuner)
            except EpisodeFailure as failure:
                outcome = failure
            try:  # also after a failure: a partial conversation is what the log viewer must show
                madness = self._collect(episode, channel)
            except EpisodeFailure as failure:
                outcome = outcome if isinstance(outcome, EpisodeFailure) else failure
        finally:
            await call_logged(tuner.aclose, "closing the episode's clients")
            await call_logged(lambda: episodes.close_episode(channel), "closing the episode's channel")
        if isinstance(outcome, EpisodeFailure):
            raise outcome
        return outcome, madness

    async def _execute(self, episode: Episode, tuner: ModelTuner) -> WorkflowOutput:
        timeout = self.config.rollout.episode_timeout
        deadline = time.monotonic() + timeout  # when the wait below times out, if the loop is free to notice
        runner = asyncio.ensure_future(self._call_workflow(episode, tuner, deadline))
        try:
            done, _ = await asyncio.wait({runner}, timeout=timeout)
        except asyncio.CancelledError:  # the batch is being cancelled: take the workflow down with it
            runner.cancel()
            raise
        if not done:
            runner.cancel()
            finished, _ = await asyncio.wait({runner}, timeout=CANCEL_GRACE_S)
            late = "" if finished else f" and did not stop within {CANCEL_GRACE_S:g}s of being cancelled"
            raise EpisodeFailure(EpisodeStatus.TIMEOUT,
                                 f"the workflow ran past rollout.episode_timeout={timeout:g}s{late}")
        if runner.cancelled():
            raise EpisodeFailure(EpisodeStatus.CANCELLED, "the workflow was cancelled (it raised CancelledError)")
        error = runner.exception()
        if isinstance(error, LoopBlocked):
            raise EpisodeFailure(EpisodeStatus.WORKFLOW_BLOCKED, str(error))
        if error is not None:
            # The agent stopped where the context or its turns ran out: an end, not a crash.
            if tuner.context_overflow:
                return GatewayLimitEnd(metadata={"context_overflow": True}, error=describe(error))
            if tuner.turn_limit:
                return GatewayLimitEnd(metadata={"turn_limit": True}, status=EpisodeStatus.TURN_LIMIT,
                                       error=describe(error))
            raise EpisodeFailure(_failure_status(error, tuner), describe(error))
        return _workflow_output(runner.result(), self.workflow_cls)

    async def _call_workflow(self, episode: Episode, tuner: ModelTuner, deadline: float) -> Any:
        if self._processes is not None:
            return await self._processes.run(tuner)
        workflow = call_workflow(self.workflow_cls, episode.task, tuner)
        if not self._loop_watchdog.active:
            return await workflow
        return await self._loop_watchdog.watch(workflow, episode.episode_id, deadline)

    def _collect(self, episode: Episode, channel: Any) -> list[str]:
        """Copy the conversation, samples and counters off the channel before it closes; the madness hits."""
        try:
            record = channel.record(trainable_targets=self.config.rollout.trainable_targets)
        except Exception as error:
            raise EpisodeFailure(EpisodeStatus.ENGINE_ERROR,
                                 f"reading the episode's record from the gateway failed: {describe(error)}") from error
        episode.messages, episode.samples = record.messages, record.samples
        episode.metrics.update(record.metrics)
        if not record.trainable and episode.status is EpisodeStatus.OK:
            episode.status = EpisodeStatus.NOT_TRAINABLE
            episode.error = "the inference engine returned text without token ids; these samples are not trained"
        return record.madness

    # -- the reward --------------------------------------------------------------------------------------------
    async def _score(self, episode: Episode, output: WorkflowOutput, handed: dict[str, Any]) -> None:
        episode.output = output.metadata
        limit_reward = {EpisodeStatus.CONTEXT_OVERFLOW: self.config.rollout.context_overflow_reward,
                        EpisodeStatus.TURN_LIMIT: self.config.rollout.turn_limit_reward}.get(episode.status)
        if limit_reward is not None:
            episode.reward, episode.success = limit_reward, False
            return
        use_judge = self.judge is not None and (output.reward is None or self.config.judge.always_run)
        if not use_judge:
            if output.reward is None:
                raise EpisodeFailure(EpisodeStatus.JUDGE_ERROR,
                                     "the workflow returned no reward and no judge is configured: set judge.type "
                                     "(or judge.judge_protocol) in the config, or return WorkflowOutput(reward=...)")
            episode.reward = output.reward
            episode.success = output.success if output.success is not None else output.reward > 0
            return
        judge_input = JudgeInput(task=episode.task, output=output, handed=handed, messages=episode.messages)
        started = time.perf_counter()
        try:
            result = await self._call_judge(judge_input)
        finally:  # also when it failed: how long a judge ran before its timeout fired is worth seeing
            episode.metrics["judge_s"] = time.perf_counter() - started
        episode.reward, episode.success = result.reward, result.success
        episode.turn_rewards = _turn_rewards(result, episode, type(self.judge))
        episode.agent_rewards = _agent_rewards(result, type(self.judge))
        episode.judge_details = result.details
        if output.reward is not None:
            episode.judge_details = {**result.details, "workflow_reward": output.reward}

    async def _call_judge(self, judge_input: JudgeInput) -> JudgeResult:
        assert self.judge is not None
        try:
            value = await self._judge_value(judge_input)
        except JudgeCallFailed as failure:
            raise EpisodeFailure(failure.status, str(failure)) from None
        return _judge_result(value, type(self.judge))

    async def _judge_value(self, judge_input: JudgeInput) -> Any:
        assert self.judge is not None
        timeout = self.config.judge.timeout
        if self._judge_processes is None:
            return await call_judge(self.judge, judge_input, timeout, self._judge_isolation)
        try:
            return await self._judge_processes.call(judge_input)
        except JudgeInputNotSendable as error:
            # The workflow handed the judge live objects (a client, a sandbox) that only mean something
            # in this process -- an async client only on this event loop: failing every episode would
            # train nothing, so this call runs here, as `judge.isolation: loop` would run it.
            if not self._warned_unsendable:
                self._warned_unsendable = True
                log.warning("judge runs on the event loop for episodes whose input cannot be pickled", error=str(error),
                            hint=PICKLED_COPY)
            return await call_judge(self.judge, judge_input, timeout, "loop")

    def _apply_madness(self, episode: Episode, madness: list[str]) -> None:
        """A madness hit replaces the reward with `rollout.agent_madness_reward` (the judge's is kept)."""
        if not madness:
            return
        penalty = self.config.rollout.agent_madness_reward
        episode.judge_details = {**episode.judge_details, "madness": madness, "judge_reward": episode.reward}
        episode.reward = penalty
        if not episode.status.failed:
            episode.status = EpisodeStatus.MADNESS


def _workflow_output(value: Any, workflow_cls: type) -> WorkflowOutput:
    """The workflow's return value as a WorkflowOutput, or a clear WORKFLOW_ERROR."""
    where = f"{workflow_cls.__qualname__}.execute"
    try:
        output = value if isinstance(value, WorkflowOutput) else WorkflowOutput.model_validate(value)
    except ValidationError:
        raise EpisodeFailure(EpisodeStatus.WORKFLOW_ERROR,
                             f"{where} returned {_short_repr(value)} ({type(value).__name__}); return "
                             f"agenttune.WorkflowOutput(reward=..., metadata={{...}}) instead") from None
    if output.reward is not None and not math.isfinite(output.reward):
        raise EpisodeFailure(EpisodeStatus.WORKFLOW_ERROR, f"{where} returned a non-finite reward ({output.reward})")
    return output


def _judge_result(value: Any, judge_cls: type) -> JudgeResult:
    where = f"{judge_cls.__qualname__}.judge"
    try:
        result = value if isinstance(value, JudgeResult) else JudgeResult.model_validate(value)
    except ValidationError:
        raise EpisodeFailure(EpisodeStatus.JUDGE_ERROR, f"{where} returned {_short_repr(value)}; return "
                             f"agenttune.JudgeResult(reward=..., success=...) instead") from None
    if not math.isfinite(result.reward):
        raise EpisodeFailure(EpisodeStatus.JUDGE_ERROR, f"{where} returned a non-finite reward ({result.reward})")
    return result


def _turn_rewards(result: JudgeResult, episode: Episode, judge_cls: type) -> list[float] | None:
    """The judge's per-call rewards, one per call of the episode (a mismatch is the judge's error)."""
    turns = result.turn_rewards
    if turns is None:
        return None
    if len(turns) != episode.num_calls or not all(math.isfinite(value) for value in turns):
        raise EpisodeFailure(EpisodeStatus.JUDGE_ERROR,
                             f"{judge_cls.__qualname__}.judge returned {len(turns)} turn_rewards for an episode of "
                             f"{episode.num_calls} model calls (they must be finite, one per call, in order)")
    return list(turns)


def _agent_rewards(result: JudgeResult, judge_cls: type) -> dict[str, float] | None:
    """The judge's per-agent rewards, all finite (a non-finite one is the judge's error)."""
    rewards = result.agent_rewards
    if rewards is not None and not all(math.isfinite(value) for value in rewards.values()):
        raise EpisodeFailure(EpisodeStatus.JUDGE_ERROR,
                             f"{judge_cls.__qualname__}.judge returned a non-finite agent reward ({rewards})")
    return None if rewards is None else dict(rewards)


def _short_repr(value: Any, limit: int = 200) -> str:
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _failure_status(error: BaseException, tuner: ModelTuner) -> EpisodeStatus:
    """Who failed the episode: the engine (the agent saw 502s), the environment, or the workflow itself."""
    if _engine_failed(tuner):
        return EpisodeStatus.ENGINE_ERROR
    if isinstance(error, EnvironmentFailure) or (isinstance(error, WorkflowProcessError) and error.environment):
        return EpisodeStatus.ENVIRONMENT_ERROR
    return EpisodeStatus.WORKFLOW_ERROR


def _engine_failed(tuner: ModelTuner) -> bool:
    """Whether the inference engine was failing this episode's requests when the workflow gave up.

    An engine error the agent recovered from (a retry that worked) does not make a later, unrelated
    failure an engine error.
    """
    return tuner.channel.engine_failing
