"""The launcher's news about its server (down, being restarted, up again), for episodes in every process.

The launcher runs in the trainer's process; with `rollout.workflow_processes` > 1 episodes run in
worker processes that share none of its memory. So the news is a small JSON file in the run
directory, `{url: {"what": ..., "restarting": ...}}`, written whole and renamed into place (a reader
never sees half of it), and its path is exported as $AGENTTUNE_OPENENV_NEWS for the length of the
run: workers are started after the launcher and inherit it. No variable, or no file: no news.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

NEWS_VARIABLE = "AGENTTUNE_OPENENV_NEWS"
POLL_S = 0.2  # how often a waiting episode looks at the news again


class NewsFile:
    """The launcher's side: what happened to the server at each url it launched, written for readers."""

    def __init__(self, path: Path):
        self.path = path
        self._news: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # the watchdog thread and stop() both write

    def note(self, url: str, what: str | None, *, restarting: bool = False) -> None:
        """`what` happened while the server is down (`restarting`: it is being started again); None: it is up."""
        key = url.rstrip("/")
        with self._lock:
            if what is None:
                self._news.pop(key, None)
            else:
                self._news[key] = {"what": what, "restarting": restarting}
            self._write()

    def _write(self) -> None:
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(self._news), encoding="utf-8")
        os.replace(partial, self.path)


def news_for(url: str) -> dict[str, Any]:
    """The news about the server at `url` ({} when there is none), read from the run's news file."""
    path = os.environ.get(NEWS_VARIABLE)
    if not path:
        return {}
    try:
        news = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not written yet, or the run is over
        return {}
    entry = news.get(url.rstrip("/")) if isinstance(news, dict) else None
    return entry if isinstance(entry, dict) else {}


def server_news(url: str) -> str:
    """What happened to the server, as a clause to add to an error ("; it exited with code -9 ...")."""
    what = news_for(url).get("what")
    return f"; {what}" if what else ""


def restarting(url: str) -> bool:
    return bool(news_for(url).get("restarting"))


async def wait_while_restarting(url: str, timeout: float) -> None:
    """Wait (up to `timeout`) while the launcher is starting the server at `url` again."""
    deadline = time.monotonic() + timeout
    while restarting(url) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
