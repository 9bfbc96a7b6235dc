"""What the test environments share: a count of live instances, served at GET /_stats, and a fault knob.

reset(hang_on_step=True) makes that instance's steps block for an hour: a server that never answers.
(A knob per session, not per server: importing openenv costs seconds, so the tests share servers.)
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

_LOCK = threading.Lock()
_LIVE: set[int] = set()
_HUNG: set[int] = set()  # instances stuck in a hanging step: the server cannot drop them until it returns
_COUNTS = {"resets": 0, "steps": 0, "closed_after_reset": 0}
_STARTED = time.time()


def on_reset(instance: object) -> None:
    with _LOCK:
        _LIVE.add(id(instance))
        _COUNTS["resets"] += 1


def on_step(instance: object, hang: bool) -> None:
    with _LOCK:
        _COUNTS["steps"] += 1
        if hang:
            _HUNG.add(id(instance))
    if hang:
        time.sleep(3600)


def on_close(instance: object) -> None:
    with _LOCK:
        if id(instance) in _LIVE:
            _LIVE.discard(id(instance))
            _COUNTS["closed_after_reset"] += 1


def count(name: str) -> None:
    """One more of `name` (a server's own counter, e.g. the calls of one tool)."""
    with _LOCK:
        _COUNTS[name] = _COUNTS.get(name, 0) + 1


def stats() -> dict[str, Any]:
    with _LOCK:
        return {**_COUNTS, "live": len(_LIVE - _HUNG), "hung": len(_HUNG), "pid": os.getpid(), "started": _STARTED}


def add_stats_route(app: Any) -> Any:
    app.add_api_route("/_stats", stats, methods=["GET"])
    return app
