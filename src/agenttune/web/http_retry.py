"""Retrying HTTP calls with exponential backoff, for clients of services that come and go.

Used by the LLM judge and the EnvService client. A call is retried when the service could not
answer (connection refused or reset, timeouts) or answered that it could not right now (5xx,
429, 408). Other answers, good or bad, come back to the caller at once: a 400 will not get better.

Calls that change state on the server (an environment `step`) must not run twice. For those pass
`idempotent=False`: they are retried only when the request certainly never reached the server
(the connection could not be made) or the server said it did not process it (502, 503, 504).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import httpx

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# The server answered but did not process the request: safe to send again even if it changes state.
NOT_PROCESSED_STATUS = frozenset({502, 503, 504})
# The request never left this machine.
NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all; the n-th wait is `backoff * 2**n`, jittered, at most `max_backoff`."""

    attempts: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0

    def delays(self) -> Iterator[float]:
        for n in range(self.attempts - 1):
            base = min(self.max_backoff, self.backoff * 2**n)
            yield base * random.uniform(0.5, 1.0)  # jitter: clients that failed together retry apart


def should_retry_status(status: int, *, idempotent: bool) -> bool:
    return status in (RETRY_STATUS if idempotent else NOT_PROCESSED_STATUS)


def should_retry_error(error: Exception, *, idempotent: bool) -> bool:
    if not isinstance(error, httpx.TransportError):
        return False
    return idempotent or isinstance(error, NOT_SENT_ERRORS)


def retry_after(response: httpx.Response, policy: RetryPolicy) -> float | None:
    """The server's Retry-After (seconds form), capped by the policy's longest wait."""
    value = response.headers.get("retry-after", "")
    try:
        return min(float(value), policy.max_backoff)
    except ValueError:
        return None


async def send_with_retries(
    send: Callable[[], Awaitable[httpx.Response]],
    policy: RetryPolicy,
    *,
    idempotent: bool = True,
    on_retry: Callable[[int, str], None] | None = None,
) -> tuple[httpx.Response, int]:
    """Call `send()` until it gets an answer worth returning; returns (response, attempts made).

    The last response is returned even when its status is still a retryable one (the caller turns
    it into an error it can explain). When every attempt failed without a response, the last
    transport error is raised. `on_retry(attempt, why)` is called before each wait (for logging).
    """
    delays = policy.delays()
    attempt = 0
    while True:
        attempt += 1
        try:
            response = await send()
        except httpx.TransportError as error:
            delay = next(delays, None) if should_retry_error(error, idempotent=idempotent) else None
            if delay is None:
                raise
            why = f"{type(error).__name__}: {error}"
        else:
            if not should_retry_status(response.status_code, idempotent=idempotent):
                return response, attempt
            delay = next(delays, None)
            if delay is None:
                return response, attempt
            delay = retry_after(response, policy) or delay
            why = f"HTTP {response.status_code}"
        if on_retry is not None:
            on_retry(attempt, why)
        await asyncio.sleep(delay)
