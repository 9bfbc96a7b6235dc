"""A byte-offset index of one rollout file, so a step with thousands of episodes opens at once.

A rollout record is mostly token arrays (ids, loss mask, logprobs, token text). The episode table
needs none of that, so the index never parses them: `RolloutRecord` is written by pydantic in field
order, which puts the small fields (`episode_id`, `task`, ..., `success`) before `samples` and the
counters (`metrics`, `duration_s`, `step`, `split`) after `judge_details`. The index parses just
those two ends of each line. Each shortcut is checked (the fragment must be a complete JSON object
on its own); when one fails, the whole line is parsed instead, so the summary is right either way.

Files are appended to while training runs: `refresh()` reads only the bytes added since the last
look, and only complete lines (a line still being written is picked up next time).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agenttune.workflow.episode import EpisodeStatus

HEAD_END = b',"samples":['  # the first key after the episode's small fields
MESSAGES = b',"messages":['  # where the conversation starts (after the token arrays)
TAIL_START = b',"metrics":{'  # the last object-valued key: only numbers and strings after it
MAX_HEAD_TRIES = 8  # candidates for HEAD_END before giving up on the shortcut (task metadata may hold one)
QUERY_PREVIEW = 160
ERROR_PREVIEW = 300
UNREADABLE = "unreadable"  # the status shown for a line that is not a JSON object


@dataclass
class Entry:
    """One line of the file: where it is, and the fields of the episode table."""

    start: int
    end: int
    summary: dict[str, Any]
    # The byte ranges worth searching: the record without its token arrays.
    search_ranges: tuple[tuple[int, int], ...] = ()


@dataclass
class Query:
    """What the episode table asks for: filters, order, one page."""

    status: str | None = None  # a status, "failed" (any failure status), or None for all
    success: bool | None = None
    policy: str | None = None  # episodes with a sample of this policy (several policies in one run)
    min_reward: float | None = None
    max_reward: float | None = None
    text: str = ""
    sort: str = "index"
    descending: bool = False
    offset: int = 0
    limit: int = 100


SORT_KEYS = {"index", "task_id", "repeat_index", "status", "reward", "success", "turns", "duration_s",
             "episode_id", "group_id"}
FAILED = frozenset({status.value for status in EpisodeStatus if status.failed} | {UNREADABLE})


@dataclass
class StepIndex:
    path: Path
    entries: list[Entry] = field(default_factory=list)
    indexed_bytes: int = 0
    identity: tuple[int, int] | None = None  # (device, inode): a replaced file is indexed afresh
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refresh(self) -> None:
        """Index lines added since the last call (all of them the first time)."""
        with self.lock:
            stat = self.path.stat()
            identity = (stat.st_dev, stat.st_ino)
            if identity != self.identity or stat.st_size < self.indexed_bytes:
                self.entries, self.indexed_bytes, self.identity = [], 0, identity
            if stat.st_size > self.indexed_bytes:
                self._scan()

    def _scan(self) -> None:
        # Plain reads, not mmap: a file truncated under an mmap kills the process with SIGBUS.
        with self.path.open("rb") as file:
            file.seek(self.indexed_bytes)
            position = self.indexed_bytes
            for line in file:
                if not line.endswith(b"\n"):
                    break  # a line still being written
                if not line.isspace():
                    self.entries.append(index_line(line, position, len(self.entries)))
                position += len(line)
            self.indexed_bytes = position

    def __len__(self) -> int:
        return len(self.entries)

    def record_bytes(self, index: int) -> bytes:
        """The raw JSON line of episode `index` (what the trajectory pane shows)."""
        entry = self.entries[index]
        with self.path.open("rb") as file:
            file.seek(entry.start)
            return file.read(entry.end - entry.start)

    def select(self, query: Query) -> tuple[list[dict[str, Any]], int]:
        """One page of episode summaries matching `query`, and how many match in all."""
        entries = [entry for entry in self.entries if _matches(entry.summary, query)]
        if query.text:
            entries = self._search(entries, query.text)
        if query.sort != "index":
            entries = _sorted(entries, query.sort, query.descending)
        elif query.descending:
            entries.reverse()
        page = entries[query.offset: query.offset + query.limit]
        return [entry.summary for entry in page], len(entries)

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(entry.summary["status"] for entry in self.entries))

    def policy_counts(self) -> dict[str, int]:
        """Episodes per policy (an episode of two agents with two policies counts for both)."""
        return dict(Counter(name for entry in self.entries for name in entry.summary.get("policies", ())))

    def _search(self, entries: list[Entry], text: str) -> list[Entry]:
        """Case-insensitive (ASCII) substring search in the records' JSON, token arrays left out."""
        needle = json.dumps(text.lower(), ensure_ascii=False)[1:-1].encode("utf-8")  # as it is in JSON
        with self.path.open("rb") as file:
            descriptor = file.fileno()
            return [entry for entry in entries
                    if any(needle in os.pread(descriptor, end - start, start).lower()
                           for start, end in entry.search_ranges)]


def index_line(line: bytes, start: int, number: int) -> Entry:
    """Summarise one line (found at byte `start`); `number` is its position among the file's records."""
    end = start + len(line)
    head, samples_at = _head(line)
    tail = _tail(line, samples_at) if head is not None else None
    if head is None or tail is None:
        return _entry_from_full_parse(line, start, number)
    messages_at = line.find(MESSAGES, samples_at)
    ranges = ((start, start + samples_at), (start + (messages_at if messages_at >= 0 else samples_at), end))
    return Entry(start, end, summarise({**head, **tail}, number), ranges)


def _head(line: bytes) -> tuple[dict[str, Any] | None, int]:
    """The fields before `samples`, parsed on their own, and where `samples` begins."""
    position = 0
    for _ in range(MAX_HEAD_TRIES):
        found = line.find(HEAD_END, position)
        if found < 0:
            break
        head = _parse_object(line[:found] + b"}")
        if head is not None and "episode_id" in head:
            return head, found
        position = found + 1  # a `"samples":[` inside the task: the next one may be the real one
    return None, -1


def _tail(line: bytes, samples_at: int) -> dict[str, Any] | None:
    """The fields from `metrics` on, parsed on their own (`metrics` is the last object-valued key)."""
    found = line.rfind(TAIL_START, samples_at)
    if found < 0:
        return None
    tail = _parse_object(b"{" + line[found + 1:])
    return tail if tail is not None and "split" in tail else None


def _parse_object(text: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _entry_from_full_parse(line: bytes, start: int, number: int) -> Entry:
    end = start + len(line)
    record = _parse_object(line)
    if record is None:
        summary = {"index": number, "episode_id": f"line {number + 1}", "task_id": "", "status": UNREADABLE,
                   "error": f"Line {number + 1} of the file is not a JSON object (cut short or corrupted).",
                   "reward": None, "success": None, "unreadable": True}
        return Entry(start, end, summary, ((start, end),))
    return Entry(start, end, summarise(record, number), ((start, end),))


def _mapping(value: Any) -> dict[str, Any]:
    """A record's sub-object, or an empty one when the file holds something else there."""
    return value if isinstance(value, dict) else {}


def summarise(record: dict[str, Any], number: int) -> dict[str, Any]:
    """The row of the episode table for one record (never token arrays: they stay on disk)."""
    task = _mapping(record.get("task"))
    metrics = _mapping(record.get("metrics"))
    error = record.get("error")
    return {
        "index": number,
        "episode_id": str(record.get("episode_id", "")),
        "task_id": str(task.get("task_id", "")),
        "group_id": str(record.get("group_id", "")),
        "repeat_index": record.get("repeat_index", 0),
        "status": str(record.get("status", "ok")),
        "reward": record.get("reward"),
        "success": record.get("success"),
        "turns": metrics.get("calls"),
        "duration_s": record.get("duration_s"),
        "query": _preview(task.get("query"), QUERY_PREVIEW),
        "error": _preview(error, ERROR_PREVIEW) if error else None,
        "step": record.get("step"),
        "split": record.get("split"),
        "policies": _policies(record.get("policies")),
    }


def _policies(value: Any) -> list[str]:
    """The record's policy names (written last in the line, so the index reads them without the samples)."""
    return [str(name) for name in value] if isinstance(value, list) else []


def _preview(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _matches(summary: dict[str, Any], query: Query) -> bool:
    status = summary["status"]
    if query.status == "failed":
        if status not in FAILED:
            return False
    elif query.status and status != query.status:
        return False
    if query.success is not None and bool(summary.get("success")) != query.success:
        return False
    if query.policy is not None and query.policy not in summary.get("policies", ()):
        return False
    reward = summary.get("reward")
    if query.min_reward is not None and (reward is None or reward < query.min_reward):
        return False
    return not (query.max_reward is not None and (reward is None or reward > query.max_reward))


def _sorted(entries: list[Entry], key: str, descending: bool) -> list[Entry]:
    """Sorted by one summary field, numbers by value, text as text; missing values last either way."""
    present = [entry for entry in entries if entry.summary.get(key) is not None]
    missing = [entry for entry in entries if entry.summary.get(key) is None]

    def sort_key(entry: Entry) -> tuple[int, Any]:
        value = entry.summary[key]
        return (0, float(value)) if isinstance(value, bool | int | float) else (1, str(value))

    return sorted(present, key=sort_key, reverse=descending) + missing


class IndexCache:
    """The indexes of recently opened files (the least recently used ones are dropped)."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._indexes: OrderedDict[Path, StepIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> StepIndex:
        with self._lock:
            index = self._indexes.pop(path, None) or StepIndex(path)
            self._indexes[path] = index
            while len(self._indexes) > self.capacity:
                self._indexes.popitem(last=False)
        index.refresh()
        return index

