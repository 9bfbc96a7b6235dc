"""What the rollout log keeps of a verifiers trace: its state, tool calls, stop reason, rewards and errors."""

from __future__ import annotations

from typing import Any


def trace_summary(trace: Any) -> dict[str, Any]:
    """A JSON-able digest of one verifiers `Trace` (the episode's output metadata, shown by logview)."""
    tool_calls = [
        {"name": call.name, "arguments": call.arguments}
        for branch in trace.branches for message in branch.messages
        if message.role == "assistant" for call in (getattr(message, "tool_calls", None) or [])
    ]
    return {
        "trace_id": trace.id,
        "ok": trace.ok,
        "stop_condition": trace.stop_condition,
        "is_timeout": trace.is_timeout,
        "tool_calls": tool_calls,
        "info": trace.info,
        "metrics": trace.metrics,
        "errors": [{"type": error.type, "message": error.message} for error in trace.errors],
        "num_model_calls": len(trace.calls),
    }
