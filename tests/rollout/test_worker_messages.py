"""rollout/messages.py: every message between the trainer and a worker crosses a MessagePipe intact.

Each message kind pickles by its own `__reduce__` (workers.py's tests cover the protocol end to end).
"""

from __future__ import annotations

import asyncio
import pickle
import socket

from agenttune import Task
from agenttune.components.engines.base import Generation, SamplingParams
from agenttune.gateway.channel import EpisodeRecord
from agenttune.rollout import messages
from agenttune.rollout.pipe import open_pipe


def one_of_each() -> list:
    sampling = SamplingParams()
    generation = Generation(token_ids=[1, 2], logprobs=[-0.5, -0.25], finish_reason="stop")
    return [
        messages.Ready(), messages.Failed("ImportError: no module named 'x'"),
        messages.Generate(0, [1, 2, 3], sampling, "request-0"),
        messages.GenerateChat(1, [{"role": "user", "content": "hi"}], None, sampling),
        messages.Abort(1), messages.Done(7, "ok", {"answer": 4}, {"answer": "4"}, EpisodeRecord(), True),
        messages.Done(8, "error", "ValueError: bad", {}, None, False), messages.Ended(7),
        messages.Run(9, Task(task_id="t", query="q"), "episode-9", sampling), messages.Cancel(9), messages.End(9),
        messages.Generated(0, generation, None), messages.Generated(2, (generation, [5, 6]), None),
        messages.Stop(),
    ]


def test_every_kind_is_covered_and_round_trips_through_pickle():
    sent = one_of_each()
    kinds = {type(message) for message in sent}
    assert kinds == {*messages.ToTrainer.__args__, *messages.ToWorker.__args__}
    assert [pickle.loads(pickle.dumps(message, pickle.HIGHEST_PROTOCOL)) for message in sent] == sent


async def test_messages_cross_a_pipe_in_order_and_an_engine_error_with_them():
    ours, theirs = socket.socketpair()
    received: list = []
    arrived = asyncio.Event()
    sent = [*one_of_each(), messages.Generated(3, None, ConnectionError("engine down"))]

    def on_message(message):
        received.append(message)
        if len(received) == len(sent):
            arrived.set()

    sender = await open_pipe(ours, lambda message: None, lambda: None)
    receiver = await open_pipe(theirs, on_message, lambda: None)
    for message in sent:
        sender.send(message)
    await asyncio.wait_for(arrived.wait(), 5)
    sender.close()
    receiver.close()
    assert received[:-1] == sent[:-1]
    error = received[-1].error
    assert (received[-1].call, type(error), str(error)) == (3, ConnectionError, "engine down")
