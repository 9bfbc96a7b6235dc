"""Pickled messages between two processes over a socket pair, read and written by an event loop.

    ours, theirs = socket.socketpair()              # hand `theirs` to the other process
    pipe = await open_pipe(ours, on_message, on_closed)
    pipe.send(("generate", 7, prompt_ids))           # pickled here: an unpicklable message raises here

Each message is a 4-byte length and a pickle, written at once (a reply waits for nothing). The
event loop reads whatever has arrived in one system call and hands every whole message to
`on_message` in order, so under load many messages cost one read and one wake-up
(multiprocessing's Connection polls and reads twice per message). Writes are not held back to
coalesce them: that saves CPU but lines every episode up behind the same burst of replies, and
episodes waited longer in the rollout benchmark (efficiency 0.57-0.65 against 0.8).
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import Callable
from typing import Any

_LENGTH = 4


class MessagePipe(asyncio.Protocol):
    def __init__(self, on_message: Callable[[Any], None], on_closed: Callable[[], None]):
        self.on_message = on_message
        self.on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def send(self, message: Any) -> None:
        """Write `message` (pickled first: an unpicklable message raises here, and nothing is sent)."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the other process is gone")
        self.transport.write(len(payload).to_bytes(_LENGTH, "big") + payload)

    def close(self) -> None:
        """Close once what was sent is written."""
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        messages, start = [], 0
        while len(buffer) - start >= _LENGTH:
            end = start + _LENGTH + int.from_bytes(buffer[start:start + _LENGTH], "big")
            if len(buffer) < end:
                break
            messages.append(pickle.loads(buffer[start + _LENGTH:end]))
            start = end
        del buffer[:start]
        for message in messages:
            self.on_message(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_closed()


async def open_pipe(sock: socket.socket, on_message: Callable[[Any], None],
                    on_closed: Callable[[], None]) -> MessagePipe:
    """Serve `sock` (one end of a socket pair) on the running event loop."""
    _, pipe = await asyncio.get_running_loop().connect_accepted_socket(
        lambda: MessagePipe(on_message, on_closed), sock)
    return pipe
