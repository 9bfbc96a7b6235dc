"""Running episodes: from a batch of tasks to finished, judged `Episode`s.

    rollout_engine.py  RolloutEngine: runs a batch of episodes (workflow -> gateway -> judge), in this
                 process or in worker processes
    workers.py   WorkflowProcesses: workflows in worker processes, talking to the host over a pipe
    judging.py   calling the judge under judge.timeout and judge.memory_limit_mb: JudgeProcesses
                 (worker processes whose whole tree is killed), call_judge (a thread or the loop)
    running.py   running user code, for the engine and the workers: call_workflow, run_in_thread,
                 describe, run_until_done
    loop_watchdog.py  LoopWatchdog: interrupts an in-process async workflow that blocks the event loop
    messages.py  the messages between the trainer and a worker (Run, Done, Generate, ...): the protocol
    pipe.py      MessagePipe: pickled messages over a socket pair, read by an event loop
    session.py   RolloutSession: what a backbone drives for a run (engine, gateway, judge, logs)
    gc.py        the garbage collector's settings while a batch runs
    log.py       the rollout log: every episode of every step, token by token, as JSON lines
    metrics.py   step metrics and metrics.jsonl
    framework_loader.py  FrameworkLoader: the agent framework a config names, and the tuner methods it adds
    process_tree.py  killing a process and all it started; what a run leaves behind ends with it

Names are imported on first use, from the module they live in, so importing `agenttune.rollout.log`
(the log viewer does) does not import the engine and the gateway.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agenttune.rollout.rollout_engine import RolloutEngine, sampling_params
    from agenttune.rollout.running import call_workflow, describe
    from agenttune.rollout.session import RolloutSession, rollout_session
    from agenttune.workflow.tuner import call_logged

_WHERE = {
    "RolloutEngine": "agenttune.rollout.rollout_engine",
    "sampling_params": "agenttune.rollout.rollout_engine",
    "call_workflow": "agenttune.rollout.running",
    "call_logged": "agenttune.workflow.tuner",
    "describe": "agenttune.rollout.running",
    "RolloutSession": "agenttune.rollout.session",
    "rollout_session": "agenttune.rollout.session",
}

__all__ = ["RolloutEngine", "RolloutSession", "call_logged", "call_workflow", "describe", "rollout_session",
           "sampling_params"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'agenttune.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
