"""Fault injection for reliability tests: break episodes on purpose, then check the aftermath.

Which episode gets which fault is a pure function of (task id, repeat index), so a test knows the
plan before a run and checks the run's records against it afterwards:

    PLAN.fault("task-7", 2)   -> "raise" | "hang" | "engine" | "flaky" | "judge" | None

`FaultyWorkflow` (config `workflow: agenttune.testing.faults:FaultyWorkflow`) asks the model one
question through the gateway and injects its episode's fault; `FaultyJudge` (`judge.judge_protocol:
agenttune.testing.faults:FaultyJudge`) scores it:

    raise   the workflow raises                        -> status workflow_error
    hang    the workflow sleeps past the timeout       -> status timeout
    engine  the engine fails every request (HTTP 502)  -> status engine_error
    flaky   the engine fails the first request; the agent's client retries and goes on -> ok
    judge   the judge raises                           -> status judge_error

Judge faults that need the judge in a worker process (`judge.isolation: process`, the default;
off in PLAN, on in the soak benchmark's plan):

    judge_block     an async judge blocks (time.sleep)       -> status judge_timeout
    judge_allocate  the judge allocates without end          -> status judge_memory
    judge_fork      the judge starts a child in a new session, then blocks -> judge_timeout, child killed
    judge_crash     the judge's process exits (os._exit)     -> status judge_error
    judge_fork_crash  judge_fork, then its process exits (os._exit) -> judge_error; the run kills the child
                    at its end (in no plan and not in EXPECTED_STATUS: the child outlives its episode)

And one more workflow fault, also off in PLAN: `drop` streams its answer, closes the connection
after the first chunk and raises (status workflow_error). SOAK_PLAN turns every fault on.

The engine faults need `failing_generate` wrapped around the engine class's `generate` (e.g.
`monkeypatch.setattr(HFEngine, "generate", failing_generate(HFEngine.generate))`). `JOURNAL`
records what each episode was given. `check_run` checks a finished run (every step written, no
episode missing from the rollout log, every failure counted by cause in metrics.jsonl) and
`Snapshot` what it left running (threads, child processes).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agenttune.components.judges.base import Judge, JudgeInput, JudgeResult
from agenttune.workflow.base import Workflow, WorkflowOutput

# What each fault must turn into; None is an episode with nothing injected.
EXPECTED_STATUS = {None: "ok", "flaky": "ok", "raise": "workflow_error", "hang": "timeout",
                   "engine": "engine_error", "judge": "judge_error", "judge_block": "judge_timeout",
                   "judge_allocate": "judge_memory", "judge_fork": "judge_timeout", "judge_crash": "judge_error",
                   "drop": "workflow_error"}
FAILURE_CAUSES = ("workflow_error", "timeout", "workflow_blocked", "engine_error", "judge_error", "judge_timeout",
                  "judge_memory", "cancelled")
# On the command line of every process a `judge_fork` fault starts: what an orphan hunt looks for.
ORPHAN_MARK = "agenttune-fault-orphan"


class InjectedFault(RuntimeError):
    """Raised on purpose by the fault-injection helpers."""


@dataclass(frozen=True)
class FaultPlan:
    """The share of episodes that get each fault (the rest run normally)."""

    raise_: float = 0.10
    hang: float = 0.05
    engine: float = 0.05
    flaky: float = 0.05
    judge: float = 0.05
    judge_block: float = 0.0
    judge_allocate: float = 0.0
    judge_fork: float = 0.0
    judge_crash: float = 0.0
    drop: float = 0.0
    seed: str = "agenttune-faults-7"  # every fault occurs among the first 8 tasks x 4 repeats

    def fault(self, task_id: str, repeat: int) -> str | None:
        digest = hashlib.sha256(f"{self.seed}:{task_id}:{repeat}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        for kind, share in (("raise", self.raise_), ("hang", self.hang), ("engine", self.engine),
                            ("flaky", self.flaky), ("judge", self.judge), ("judge_block", self.judge_block),
                            ("judge_allocate", self.judge_allocate), ("judge_fork", self.judge_fork),
                            ("judge_crash", self.judge_crash), ("drop", self.drop)):
            if draw < share:
                return kind
            draw -= share
        return None


PLAN = FaultPlan()
# Every fault at once, 40 % of the episodes in all (bench/soak.py).
SOAK_PLAN = FaultPlan(raise_=0.05, hang=0.03, engine=0.04, flaky=0.04, judge=0.04, judge_block=0.04,
                      judge_allocate=0.03, judge_fork=0.03, judge_crash=0.03, drop=0.07,
                      seed="agenttune-soak-77")  # every fault at least twice among 16 tasks x 4 repeats


class Journal:
    """What each episode was given, by episode id (thread-safe: sync workflows run in threads)."""

    def __init__(self) -> None:
        self._faults: dict[str, str | None] = {}
        self._failed_once: set[str] = set()
        self._lock = threading.Lock()

    def record(self, episode_id: str, fault: str | None) -> None:
        with self._lock:
            self._faults[episode_id] = fault

    def fault_of(self, episode_id: str | None) -> str | None:
        with self._lock:
            return self._faults.get(episode_id or "")

    def first_failure(self, episode_id: str) -> bool:
        """True the first time it is asked about `episode_id` (the flaky engine fails that request)."""
        with self._lock:
            first = episode_id not in self._failed_once
            self._failed_once.add(episode_id)
            return first

    @property
    def episodes(self) -> dict[str, str | None]:
        with self._lock:
            return dict(self._faults)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._failed_once.clear()


JOURNAL = Journal()


def repeat_of(episode_id: str) -> int:
    """The repeat index in a rollout-engine episode id (`{batch}-{task index}-{repeat}`)."""
    return int(episode_id.rsplit("-", 1)[-1])


class FaultyWorkflow(Workflow):
    """One question to the model, with the fault `plan` gives this episode."""

    plan: FaultPlan = PLAN

    async def execute(self, task, tuner):
        fault = self.plan.fault(task.task_id, repeat_of(tuner.episode_id))
        JOURNAL.record(tuner.episode_id, fault)
        tuner.update_judge_input_dictionary(fault=fault)
        await self.setup(task, tuner)
        if fault == "raise":
            raise InjectedFault("the workflow raised (injected)")
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault == "drop":
            await self.drop_mid_stream(task, tuner)
        answer = await self.ask(task, tuner)
        tuner.update_judge_input_dictionary(final_answer=answer)
        return WorkflowOutput(metadata={"final_answer": answer, "fault": fault})

    async def setup(self, task, tuner) -> None:
        """Runs before the fault strikes (subclasses acquire resources here, e.g. an environment)."""

    async def drop_mid_stream(self, task, tuner) -> None:
        client = tuner.as_async_openai_client(max_retries=0)
        stream = await client.chat.completions.create(
            model=tuner.model_name, messages=[{"role": "user", "content": task.query or task.task_id}], stream=True)
        async for _ in stream:
            break
        await stream.close()  # the connection goes away with the reply half sent
        raise InjectedFault("the workflow dropped its connection mid-stream (injected)")

    async def ask(self, task, tuner) -> str:
        # One retry, as agents' clients usually have: it rides out a flaky engine, not a broken one.
        client = tuner.as_async_openai_client(max_retries=1)
        reply = await client.chat.completions.create(
            model=tuner.model_name, messages=[{"role": "user", "content": task.query or task.task_id}])
        return reply.choices[0].message.content or ""


class SoakWorkflow(FaultyWorkflow):
    """FaultyWorkflow with every fault on (SOAK_PLAN)."""

    plan = SOAK_PLAN


class FaultyJudge(Judge):
    """Raises for episodes planned so; otherwise 1.0 for an answer of even length (rewards vary)."""

    name = "faulty"

    async def judge(self, judge_input: JudgeInput) -> JudgeResult:
        fault = judge_input.handed.get("fault")
        if fault == "judge":
            raise InjectedFault("the judge raised (injected)")
        if fault is not None and fault.startswith("judge_"):
            misbehave(fault)
        answer = str(judge_input.final_answer or "")
        return JudgeResult(reward=float(len(answer) % 2 == 0), success=len(answer) % 2 == 0)


def misbehave(fault: str) -> None:
    """What a judge with a `judge_*` fault does; blocking calls on purpose (the judge is async)."""
    if fault in ("judge_fork", "judge_fork_crash"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", ORPHAN_MARK],  # noqa: S603
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if fault in ("judge_block", "judge_fork"):
        time.sleep(3600)
    if fault == "judge_allocate":
        hoard = []
        while True:
            hoard.append(bytearray(32 * 1024 * 1024))  # zero-filled: resident at once
            time.sleep(0.01)
    if fault in ("judge_crash", "judge_fork_crash"):
        os._exit(9)


def orphans() -> list[int]:
    """Processes a `judge_fork` fault started that are still alive (anywhere on the machine)."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if ORPHAN_MARK in (process.info["cmdline"] or []) and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process.pid)
    return found


def failing_generate(generate: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an engine's `generate` so requests of `engine` episodes fail, and the first of `flaky` ones."""

    @functools.wraps(generate)
    async def faulty(self, prompt_ids, sampling, *, request_id=None):
        fault = JOURNAL.fault_of(request_id)
        if fault == "engine" or (fault == "flaky" and JOURNAL.first_failure(request_id)):
            raise InjectedFault(f"the inference engine failed ({fault}, injected)")
        return await generate(self, prompt_ids, sampling, request_id=request_id)

    return faulty


# -- checking a finished run ----------------------------------------------------------------------
@dataclass
class StepReport:
    step: int
    episodes: int
    statuses: Counter[str]


def check_run(run_dir: Path, *, steps: list[int], episodes_per_step: int, split: str = "train",
              also_failed: Callable[[dict[str, Any]], bool] | None = None) -> list[StepReport]:
    """Check a finished run against `JOURNAL`; returns what each step held. Raises AssertionError.

    * metrics.jsonl has exactly `steps`;
    * each step's rollout log holds `episodes_per_step` records, every one started by the workflow
      (and every episode the workflow started is in some step's log: none lost);
    * each record's status is what its fault must turn into, and `failures/<status>` in the step's
      metrics counts exactly those (zero for causes that did not happen). `also_failed(record)` may
      accept other failures that the test caused on purpose (a killed server).
    """
    run_dir = Path(run_dir)
    metrics = {record["step"]: record for record in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    assert sorted(metrics) == steps, f"steps written: {sorted(metrics)}, expected {steps}"
    started = JOURNAL.episodes
    logged: set[str] = set()
    reports = []
    for step in steps:
        path = run_dir / "rollouts" / f"step_{step:06d}_{split}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert len(records) == episodes_per_step, f"step {step}: {len(records)} episodes logged, expected {episodes_per_step}"
        statuses: Counter[str] = Counter()
        for record in records:
            episode = record["episode_id"]
            assert episode in started, f"step {step}: episode {episode} is logged but never started"
            expected = EXPECTED_STATUS[started[episode]]
            caused = also_failed is not None and record["status"] != "ok" and also_failed(record)
            assert record["status"] == expected or caused, (f"step {step}: episode {episode} with fault {started[episode]!r} "
                                                  f"has status {record['status']!r}, expected {expected!r}: {record['error']}")
            if started[episode] == "flaky" and not caused:
                assert record["metrics"].get("engine_errors") == 1.0, record["metrics"]
            statuses[record["status"]] += 1
            logged.add(episode)
        for cause in FAILURE_CAUSES:
            counted = metrics[step].get(f"failures/{cause}")
            assert counted == statuses[cause], f"step {step}: failures/{cause} = {counted}, logged {statuses[cause]}"
        assert metrics[step]["failure_rate"] == sum(statuses[c] for c in statuses if c != "ok") / len(records)
        engine_errors = sum(record["metrics"].get("engine_errors", 0.0) for record in records)
        assert metrics[step]["errors/engine"] == engine_errors  # retried ones included
        reports.append(StepReport(step, len(records), statuses))
    lost = set(started) - logged
    assert not lost, f"{len(lost)} episodes ran but are missing from the rollout log: {sorted(lost)[:5]}"
    return reports


# Threads libraries keep for the life of the process, not left behind by a run: tqdm's monitor
# (started by transformers' "Loading weights" bar) lives on once started.
LIBRARY_THREADS = frozenset({"tqdm_monitor"})
LIBRARY_PROCESS = "multiprocessing.resource_tracker"


@dataclass
class Snapshot:
    """The threads and child processes alive at one moment, to find what a run left behind."""

    threads: set[int]
    children: set[int]

    @classmethod
    def take(cls) -> Snapshot:
        return cls({thread.ident for thread in threading.enumerate() if thread.ident is not None},  # (all started)
                   set(child_processes()))

    def new_threads(self, *, grace_s: float = 10.0) -> list[str]:
        """Names of threads started since, still alive after up to `grace_s` (they may be winding down)."""
        deadline = time.monotonic() + grace_s
        while True:
            extra = [thread.name for thread in threading.enumerate()
                     if thread.ident not in self.threads and thread.name not in LIBRARY_THREADS]
            if not extra or time.monotonic() > deadline:
                return extra
            time.sleep(0.1)

    def new_children(self) -> dict[int, str]:
        """Child processes started since and still alive: pid -> command line (multiprocessing's resource
        tracker, started with the first worker process and kept for the life of the interpreter, aside)."""
        return {pid: command for pid, command in child_processes().items()
                if pid not in self.children and LIBRARY_PROCESS not in command}


def child_processes() -> dict[int, str]:
    """This process's live children: pid -> command line (Linux /proc)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                children[int(entry.name)] = (entry / "cmdline").read_text().replace("\0", " ").strip()
        except (OSError, IndexError, ValueError):
            continue  # it ended while we looked
    return children
