"""Send AWorld's log files (and failed-request dumps) into the run directory instead of `./logs`.

AWorld opens its log files (aworld.log, llm.log, trajectory.log, ...) when `aworld.logs.util` is
imported, in `$AWORLD_LOG_PATH`, default `<current directory>/logs`. When AWorld is not imported yet,
setting the variable is enough. When it is (a training script imports aworld first), each of its
loggers is set up again the way AWorld's own `reset_level` does it, pointing at the new directory;
the files it had opened and not yet written to are removed, with the folder when that leaves it empty.
Lines AWorld wrote before the run started stay where they are.

AWorld's console output is turned off too (everything is in the files), unless the user asked for it
with AWORLD_DISABLE_CONSOLE_LOG=false.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG_PATH_VARIABLE = "AWORLD_LOG_PATH"
CONSOLE_VARIABLE = "AWORLD_DISABLE_CONSOLE_LOG"


def redirect_failed_requests(directory: Path) -> None:
    """Write AWorld's failed-request dumps under `directory`, not `<current directory>/failed_requests`.

    `LLMAgent._save_failed_request_context` builds its path from `os.getcwd()`, and the working
    directory cannot be changed per episode in one event loop, so the method is replaced.
    """
    import json
    import time

    from aworld.agents.llm_agent import LLMAgent

    async def save_failed_request(agent: Any, messages: Any, tools: Any, error: str, attempt: int,
                                  context: Any) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        session_id = getattr(context, "session_id", None) or "unknown"
        path = directory / f"{agent.id()}_{session_id}_{time.strftime('%Y%m%d_%H%M%S')}.json"
        record = {"agent": agent.name(), "session_id": session_id, "error": error, "attempt": attempt,
                  "messages": messages, "tools": tools}
        path.write_text(json.dumps(record, ensure_ascii=False, default=str, indent=2), encoding="utf-8")

    LLMAgent._save_failed_request_context = save_failed_request


def redirect_logs(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[LOG_PATH_VARIABLE] = str(directory)  # loggers made from now on, MCP servers AWorld starts
    os.environ.setdefault(CONSOLE_VARIABLE, "true")
    util = sys.modules.get("aworld.logs.util")
    if util is not None:
        _reopen_all(util, directory)
    redirect_failed_requests(directory / "failed_requests")  # imports aworld: after AWORLD_LOG_PATH is set


def _reopen_all(util: Any, directory: Path) -> None:
    disable_console = os.environ[CONSOLE_VARIABLE].lower() in ("true", "1", "yes")
    for aworld_logger in [value for value in vars(util).values() if isinstance(value, util.AWorldLogger)]:
        old_files = _reopen(aworld_logger, util, disable_console)
        for old in old_files:
            _remove_if_untouched(old, directory)


def _reopen(aworld_logger: Any, util: Any, disable_console: bool) -> list[Path]:
    """Remove this logger's sinks and add them again (AWorld reads AWORLD_LOG_PATH when adding)."""
    from loguru import logger as base_logger

    old_files = []
    for attribute in ("log_id", "file_log_id", "error_log_id"):
        handler_id = aworld_logger.__dict__.pop(attribute, None)
        if handler_id is None:
            continue
        path = _sink_path(base_logger, handler_id)
        if path is not None:
            old_files.append(path)
        try:
            base_logger.remove(handler_id)
        except ValueError:  # already removed
            pass
    tag, name = aworld_logger.tag, aworld_logger.name
    util.AWorldLogger._added_handlers.difference_update({f"{name}_{tag}", f"{name}_{tag}_error"})
    # `formater` holds the formatter given, when it was a format string; AWorld built the others itself.
    formatter = aworld_logger.formater if isinstance(aworld_logger.formater, str) else None
    file_config = {key: value for key, value in (aworld_logger.file_log_config or {}).items() if key != "level"}
    aworld_logger.__init__(tag=tag, name=name, console_level=aworld_logger.console_level, formatter=formatter,
                           disable_console=disable_console, file_log_config=file_config or None)
    return old_files


def _sink_path(base_logger: Any, handler_id: int) -> Path | None:
    handler = base_logger._core.handlers.get(handler_id)  # loguru keeps no public record of a sink's file
    path = getattr(getattr(handler, "_sink", None), "_path", None)
    return Path(path) if path else None


def _remove_if_untouched(path: Path, new_directory: Path) -> None:
    if path.parent == new_directory:
        return
    try:
        if path.is_file() and path.stat().st_size == 0:
            path.unlink()
        if path.parent.is_dir() and not any(path.parent.iterdir()):
            path.parent.rmdir()
    except OSError:  # someone else's file or folder: leave it
        pass
