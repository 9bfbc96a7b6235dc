"""Tinker's futures: every POST answers a request id at once; `retrieve_future` fetches the result.

The SDK polls `/api/v1/retrieve_future` and retries at once on a 408 (no backoff), so a pending
request is held open here for up to `poll_s` before it is answered 408 `try_again`: a few polls a
minute per request instead of a busy loop. Model work runs on one worker thread, in the order the
requests arrived: the SDK sends each training client's requests in its `seq_id` order, and one thread
keeps torch from fighting itself for the CPU cores. Sample requests are coroutines on the event loop
instead (`submit_async`: sampling.py batches them through the `hf` engine); the sampler keeps the
model to itself while it decodes by holding the worker thread (`run_on_worker`), so training queued
meanwhile waits for it, and it waits for the training queued before it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

MAX_KEPT_RESULTS = 10_000  # finished results nobody fetched are dropped oldest first beyond this
KEPT_FETCHED = 256  # fetched results are kept a while: a client whose connection broke asks again


class TinkerError(Exception):
    """A request the server refuses: `status` is the HTTP status, the message one sentence for the user."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Result:
    """A finished request: a JSON body, or protobuf bytes (forward_backward and sample results)."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None


def failed(message: str, category: str) -> Result:
    """The SDK's RequestFailedResponse: it raises RequestFailedError with this message."""
    return Result(json={"error": message, "category": category})


class Futures:
    """Request ids, their results, and the one worker thread that computes them."""

    def __init__(self, poll_s: float = 20.0):
        self.poll_s = poll_s
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agenttune-tinker")
        self._pending: dict[str, asyncio.Future[Result]] = {}
        self._done: OrderedDict[str, Result] = OrderedDict()
        self._fetched: OrderedDict[str, Result] = OrderedDict()
        self._before_close: list[Callable[[], None]] = []
        # Requests submitted to the worker thread (counted on the event loop) and started (counted on
        # the worker thread): their difference is how many wait.
        self._submitted = self._started = 0

    def submit(self, work: Callable[[], Result]) -> str:
        """Queue `work` (run on the worker thread); returns its request id. Call on the event loop."""
        request_id = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        self._submitted += 1
        future = loop.run_in_executor(self._worker, self._run, work)
        self._pending[request_id] = future
        future.add_done_callback(lambda done: self._finish(request_id, done))
        return request_id

    def waiting(self) -> int:
        """How many submitted requests wait for the worker thread (not yet started)."""
        return self._submitted - self._started

    def _run(self, work: Callable[[], Result]) -> Result:
        self._started += 1
        return _guarded(work)

    def submit_async(self, work: Callable[[], Awaitable[Result]]) -> str:
        """Run the coroutine `work()` on the event loop (not the worker thread); returns its request id.
        Call on the event loop."""
        request_id = uuid.uuid4().hex
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_task(_guarded_async(work))
        self._pending[request_id] = future
        future.add_done_callback(lambda done: self._finish(request_id, done))
        return request_id

    def run_on_worker(self, work: Callable[[], None]) -> asyncio.Future[None]:
        """Run `work` on the worker thread, after the requests queued before it (no request id)."""
        return asyncio.get_running_loop().run_in_executor(self._worker, work)

    def before_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the futures close, before waiting for the worker thread (a sampler
        holding it lets go)."""
        self._before_close.append(callback)

    async def wait(self, request_id: str) -> Result | None:
        """The result, waiting up to `poll_s`; None while still pending. Unknown ids are a TinkerError."""
        future = self._pending.get(request_id)
        if future is not None:
            try:
                await asyncio.wait_for(asyncio.shield(future), self.poll_s)
            except TimeoutError:
                return None
            self._finish(request_id, future)  # (unless its done callback ran already)
        return self._fetch(request_id)

    def _fetch(self, request_id: str) -> Result:
        if request_id in self._done:
            self._fetched[request_id] = self._done.pop(request_id)
            while len(self._fetched) > KEPT_FETCHED:
                self._fetched.popitem(last=False)
        result = self._fetched.get(request_id)
        if result is None:
            raise TinkerError(f"No request has the id {request_id!r} (results are kept until fetched).", 404)
        return result

    def close(self) -> None:
        for callback in self._before_close:
            callback()
        self._worker.shutdown(wait=True, cancel_futures=True)

    def _finish(self, request_id: str, future: asyncio.Future[Result]) -> None:
        if self._pending.pop(request_id, None) is None:
            return
        if not future.cancelled():
            self._store(request_id, future.result())

    def _store(self, request_id: str, result: Result) -> None:
        self._done[request_id] = result
        while len(self._done) > MAX_KEPT_RESULTS:
            self._done.popitem(last=False)


def _guarded(work: Callable[[], Result]) -> Result:
    """Run `work`; a refusal becomes a user error, anything else a server error (never an escape:
    the SDK would otherwise poll a future that never resolves)."""
    try:
        return work()
    except TinkerError as error:
        return failed(str(error), "user")
    except Exception as error:  # noqa: BLE001 - reported to the client as the request's failure
        return failed(f"The server failed this request: {type(error).__name__}: {error}", "server")


async def _guarded_async(work: Callable[[], Awaitable[Result]]) -> Result:
    """`_guarded` for a coroutine."""
    try:
        return await work()
    except TinkerError as error:
        return failed(str(error), "user")
    except Exception as error:  # noqa: BLE001 - reported to the client as the request's failure
        return failed(f"The server failed this request: {type(error).__name__}: {error}", "server")
