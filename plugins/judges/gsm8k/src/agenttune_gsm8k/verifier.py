"""math-verify with a hard time limit, safe to call from any thread or from async code.

Comparisons run in worker processes (`agenttune_gsm8k.verify_worker`). A comparison that runs past
`timeout` gets its worker killed (a thread could not be stopped: sympy would keep a core busy for
the rest of the run) and the verdict "undecided"; the next comparison starts a fresh worker. Up to
`max_workers` comparisons run at once; callers beyond that wait for a free worker. A worker's
address space is capped at `memory_mb` above what math-verify itself maps: a comparison that needs
more fails there with MemoryError (verdict undecided) and the worker goes on.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """`equal` is None when math-verify could not decide; `reason` says why (or "math-verify")."""

    equal: bool | None
    reason: str
    gold: str = ""
    answer: str = ""


class WorkerFailed(Exception):
    """The worker process died, timed out or could not start."""


class _Worker:
    """One `verify_worker` process and a thread that turns its stdout into a queue of replies."""

    def __init__(self, startup_timeout: float, memory_mb: int):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agenttune_gsm8k.verify_worker", str(memory_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="agenttune-math-verify-reader").start()
        hello = self._reply(startup_timeout)
        if not hello.get("ready"):
            self.kill()
            raise WorkerFailed(f"math-verify is unavailable: {hello.get('error', 'the worker did not start')}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self.replies.put(json.loads(line))
            except json.JSONDecodeError:  # stray output (a library printing): not a reply
                continue
        self.replies.put(None)  # end of file: the process is gone

    def _reply(self, timeout: float) -> dict[str, Any]:
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise WorkerFailed(f"no answer within {timeout:g}s") from None
        if reply is None:
            raise WorkerFailed(f"the worker exited (code {self.process.wait()})")
        return reply

    def ask(self, gold: str, answer: str, timeout: float) -> dict[str, Any]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps({"gold": gold, "answer": answer}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise WorkerFailed(f"the worker is gone ({error})") from error
        return self._reply(timeout)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class MathVerifier:
    """Compares a gold answer with a model's answer through math-verify, never for longer than `timeout`."""

    def __init__(self, timeout: float = 5.0, max_workers: int = 2, startup_timeout: float = 60.0,
                 memory_mb: int = 1024):
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.startup_timeout = startup_timeout
        self.max_workers = max_workers
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(max_workers)
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._unavailable: str | None = None  # set once math-verify is known to be missing
        self.timeouts = 0

    def compare(self, gold: str, answer: str) -> Verdict:
        if self._unavailable:
            return Verdict(None, self._unavailable)
        with self._slots:
            try:
                worker = self._take()
            except WorkerFailed as error:
                self._unavailable = str(error)
                # here: importing it costs `agenttune --help` 0.1 s
                from agenttune.plugin_api import get_logger

                get_logger("gsm8k.verifier").warning("math-verify cannot run; answers are checked strictly",
                                                     error=str(error))
                return Verdict(None, str(error))
            started = time.monotonic()
            try:
                reply = worker.ask(gold, answer, self.timeout)
            except WorkerFailed as error:
                self._discard(worker)
                self.timeouts += 1
                elapsed = time.monotonic() - started
                return Verdict(None, f"math-verify stopped after {elapsed:.1f}s: {error}")
            self._idle.put(worker)
        return Verdict(reply.get("equal"), reply.get("reason", ""), reply.get("gold", ""), reply.get("answer", ""))

    def _take(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            worker = _Worker(self.startup_timeout, self.memory_mb)
            with self._lock:
                self._all.add(worker)
            return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def close(self) -> None:
        """Stop every worker process (the judge calls this when the run ends)."""
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()
        while not self._idle.empty():
            self._idle.get_nowait()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
