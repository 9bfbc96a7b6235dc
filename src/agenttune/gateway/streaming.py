"""A reply's text as OpenAI stream deltas, while it is generated.

The finished reply is read exactly as a non-streamed one (`ChatCompletions._finish`), so what is
recorded and what the stream adds up to cannot differ from a plain call. While tokens arrive, the
text is sent as `reasoning_content` or `content` deltas as soon as it can no longer turn out to be
something else: a tail that may be the start of `</think>`, `<tool_call>`, a stop string or an
unfinished UTF-8 character waits for the next token, and so does trailing whitespace before a
possible tool call (the parser strips it). Tool calls are sent when the reply is complete (only then
is it known whether they parse), as OpenAI does: the call's id and name first, then its arguments
in fragments. If the finished reply disagrees with what was already sent (a model that writes
`</think>` without having opened it), the rest is sent as far as it still adds up, and the call is
counted as `stream_mismatch`.
"""

from __future__ import annotations

from typing import Any

from agenttune.components.parsers.base import ReasoningParser

_ARGUMENT_FRAGMENT = 24  # characters of a tool call's arguments per chunk


class DeltaStream:
    def __init__(self, *, reasoning: ReasoningParser | None, tool_start: str | None, stops: tuple[str, ...],
                 prompt_opens_thinking: bool):
        self.reasoning = reasoning
        # The markers around the reasoning; unused without a reasoning parser (nothing is reasoning then).
        self.open, self.close = (reasoning.OPEN, reasoning.CLOSE) if reasoning is not None else ("", "")
        self.tool_start = tool_start
        self.stops = stops
        self.in_reasoning = reasoning is not None and prompt_opens_thinking
        self.decided = reasoning is None or prompt_opens_thinking  # known whether the reply opens <think>
        self.answer_offset = 0  # where the answer starts in the text, once `</think>` closed the reasoning
        self.sent = {"reasoning_content": "", "content": ""}
        self.mismatch = False

    def push(self, text: str) -> list[dict[str, Any]]:
        """Deltas for the text generated so far (the whole of it, not only the new part)."""
        if text.endswith("\ufffd"):  # the last token ends inside a UTF-8 character
            return []
        if not self.decided:
            opening = text.lstrip("\n")
            if self.open.startswith(opening):
                return []  # "", "<", "<th", ...: not known yet
            self.decided = True
            self.in_reasoning = opening.startswith(self.open)
        if self.in_reasoning:
            return self._reasoning(text)
        return self._content(text)

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        start = text.find(self.open)
        body = text[start + len(self.open):] if 0 <= start and not text[:start].strip() else text
        body = body.lstrip("\n")
        close = body.find(self.close)
        if close < 0:
            return self._send("reasoning_content", _held_back(body, (self.close,)).rstrip("\n"))
        deltas = self._send("reasoning_content", body[:close].rstrip("\n"))
        self.in_reasoning = False
        self.answer_offset = len(text) - len(body) + close + len(self.close)
        return deltas + self._content(text)

    def _content(self, text: str) -> list[dict[str, Any]]:
        answer = text[self.answer_offset:]
        if self.answer_offset:
            answer = answer.lstrip("\n")
        markers = self.stops + ((self.tool_start,) if self.tool_start else ())
        cut = min((at for at in (answer.find(marker) for marker in markers) if at >= 0), default=-1)
        if cut >= 0:
            answer = answer[:cut]
        else:
            answer = _held_back(answer, markers)
        if self.tool_start:  # the parser strips whitespace before a call
            answer = answer.rstrip()
        return self._send("content", answer)

    def _send(self, field: str, text: str) -> list[dict[str, Any]]:
        sent = self.sent[field]
        if not text.startswith(sent) or len(text) == len(sent):
            return []
        self.sent[field] = text
        return [{field: text[len(sent):]}]

    def finish(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """The deltas that complete the stream into `message` (the reply as a plain call returns it)."""
        deltas = []
        for field in ("reasoning_content", "content"):
            final, sent = message.get(field) or "", self.sent[field]
            if final.startswith(sent):
                if len(final) > len(sent):
                    deltas.append({field: final[len(sent):]})
            else:
                self.mismatch = True
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                           "function": {"name": function["name"], "arguments": ""}}]})
            arguments = function["arguments"]
            for at in range(0, len(arguments), _ARGUMENT_FRAGMENT):
                deltas.append({"tool_calls": [{"index": index, "function": {
                    "arguments": arguments[at:at + _ARGUMENT_FRAGMENT]}}]})
        return deltas


def _held_back(text: str, markers: tuple[str, ...]) -> str:
    """`text` without a tail that could be the beginning of one of `markers`."""
    keep = len(text)
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                keep = min(keep, len(text) - size)
                break
    return text[:keep]
