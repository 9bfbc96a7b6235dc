"""The limits an agenttune HTTP server enforces, and its rate-limited warnings."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("agenttune.web")

MIB = 2**20
WARNING_INTERVAL_S = 60.0


@dataclass(frozen=True)
class ServerLimits:
    """Per-server limits. The defaults are the documented ones (SECURITY.md)."""

    max_body_bytes: int = 8 * MIB  # a larger request body is answered 413 before it is buffered
    request_timeout_s: float = 30.0  # a request (headers and body) must arrive within this
    keep_alive_timeout_s: float = 30.0  # an idle keep-alive connection is closed after this
    max_connections: int = 1000  # connections beyond it are answered 503 and closed

    def describe(self) -> str:
        return (f"max body {self.max_body_bytes / MIB:g} MiB, request timeout {self.request_timeout_s:g} s, "
                f"keep-alive {self.keep_alive_timeout_s:g} s, {self.max_connections} connections")


def error_body(message: str, *, code: str, type: str = "invalid_request_error") -> bytes:
    """An OpenAI-style error body: the shape every refusal of every agenttune server has."""
    return json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()


class RateLimitedWarnings:
    """One warning per condition per interval; the ones in between are counted and reported with the next.

    A flood (thousands of slow or refused connections a second) must not turn into a flood of log
    lines, which would cost more than the connections themselves.
    """

    def __init__(self, interval_s: float = WARNING_INTERVAL_S):
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def permits(self, condition: str) -> bool:
        """Whether `condition` may be logged now (else it is counted for the next warning)."""
        now = time.monotonic()
        last = self._last.get(condition)
        if last is not None and now - last < self.interval_s:
            self._suppressed[condition] += 1
            return False
        self._last[condition] = now
        return True

    def warn(self, condition: str, message: str, **fields: Any) -> bool:
        """Log `message` unless `condition` was logged within the interval; True when logged."""
        if not self.permits(condition):
            return False
        more = self._suppressed.pop(condition, 0)
        if more:
            fields["more_since_last_warning"] = more
        log.warning(message, condition=condition, **fields)
        return True


WARNINGS = RateLimitedWarnings()  # one per process: the servers share the log
