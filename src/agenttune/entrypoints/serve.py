"""`agenttune serve`: the configured model and engine as a standalone OpenAI-compatible server.

    agenttune serve --model tiny://default             # http://127.0.0.1:8000/v1 until Ctrl-C
    agenttune serve --conf train.yaml --port 9000      # the training config's model, engine, gateway

Point an agent at the printed base URL to debug it before training: it gets the same gateway
(template, tool and reasoning parsers, tool_choice and response_format, streaming) and the same
engine the rollouts will use. Any API key is accepted; each distinct key is one conversation
(`key.agent` files calls under an agent, as in training), recorded like an episode to
`<run_dir>/rollouts/step_000000_serve.jsonl`, which `agenttune logview <run_dir>` shows token by token.
The file is rewritten whole (atomically) a second after calls finish, and when the server stops;
the writing runs in a thread, so the server keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

from agenttune.config.models import AgentTuneConfig
from agenttune.errors import UserError
from agenttune.rollout.log import RolloutLog
from agenttune.workflow.episode import Episode
from agenttune.workflow.task import Task

SPLIT = "serve"
FLUSH_INTERVAL_S = 1.0


class ServeRecorder:
    """Writes every conversation the gateway has served to the rollout log, as episodes."""

    def __init__(self, gateway: Any, log: RolloutLog, tokenizer: Any):
        self.gateway, self.log, self.tokenizer = gateway, log, tokenizer
        self.started = time.time()
        self._written_calls = 0
        self._episodes: dict[str, tuple[tuple, Episode]] = {}  # per conversation, until it changes
        self._writing = threading.Lock()  # the last write (at stop) waits for one still in its thread

    def calls(self) -> int:
        return sum(int(channel.counters["calls"]) for channel in self.gateway.channels())

    def flush(self) -> Path | None:
        """Rewrite the log when calls finished since the last write; returns its path when written."""
        episodes = self._changed()
        return self._write(episodes) if episodes is not None else None

    def _changed(self) -> list[Episode] | None:
        """Every conversation as an episode, when calls finished since the last look (on the event loop:
        the channels change there); only the conversations that changed are built anew."""
        calls = self.calls()
        if calls == self._written_calls:
            return None
        self._written_calls = calls
        return [self._episode(channel) for channel in self.gateway.channels()]

    def _write(self, episodes: list[Episode]) -> Path:
        with self._writing:
            return self.log.replace(0, SPLIT, episodes, self.tokenizer)

    def _episode(self, channel: Any) -> Episode:
        version = tuple(channel.counters.items())
        cached = self._episodes.get(channel.key)
        if cached is not None and cached[0] == version:
            return cached[1]
        record = channel.record()
        first_user = next((message["content"] for message in record.messages if message["role"] == "user"), "")
        episode = Episode(episode_id=channel.episode_id, task=Task(task_id=channel.episode_id, query=first_user),
                          group_id=SPLIT, samples=record.samples, messages=record.messages, metrics=record.metrics,
                          started_at=self.started)
        self._episodes[channel.key] = (version, episode)
        return episode

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            episodes = self._changed()
            if episodes is not None:  # (serialising thousands of samples would stall every client)
                await asyncio.to_thread(self._write, episodes)


def policies_model(config: AgentTuneConfig, adapters: Path | None = None) -> Any:
    """With `policies:`, the base model holding every policy's adapter (a request's `model: writer` picks
    one): from `adapters` (a checkpoint's model/ directory, model/<policy>/ each), else each policy's
    `init`, else fresh (the base model's output). None without policies: the engine loads the model."""
    if not config.policies.enabled:
        if adapters is not None:
            raise UserError(f"--adapters {str(adapters)!r} is given but the config defines no policies, so there "
                            "are no adapters to load.",
                            hint="Use the training run's config (its policies: section), or leave --adapters out.")
        return None
    if config.engine.type != "hf":
        raise UserError(f"Serving several policies needs the hf engine (engine.type=hf); engine.type is "
                        f"{config.engine.type!r}.", hint="Set engine.type=hf (docs/multi_policy.md).")
    if adapters is not None and not adapters.is_dir():
        raise UserError(f"--adapters {str(adapters)!r} is not a directory.",
                        hint="Give a checkpoint's model/ directory, e.g. runs/x/checkpoints/step_000020/model.")
    from agenttune.backbones.local.policies import with_adapters
    from agenttune.components.engines.model_loading import load_model

    return with_adapters(load_model(config.model), config, checkpoint=adapters).eval()


async def serve(config: AgentTuneConfig, run_dir: Path, *, ready: Any = None,
                stop: asyncio.Event | None = None, adapters: Path | None = None) -> None:
    """Serve until `stop` is set (or SIGINT / SIGTERM); `ready(base_url)` is called once listening.
    `adapters`: with policies, the checkpoint's model/ directory to load their adapters from."""
    from agenttune.components.engines.model_loading import load_tokenizer
    from agenttune.gateway import Gateway
    from agenttune.registry.resolution import build_engine

    tokenizer = load_tokenizer(config.model)
    engine = build_engine(config, tokenizer, model=policies_model(config, adapters))
    stop = stop or asyncio.Event()
    try:
        async with Gateway(engine, tokenizer, config, open_access=True) as gateway:
            recorder = ServeRecorder(gateway, RolloutLog(run_dir / "rollouts"), tokenizer)
            flushing = asyncio.create_task(recorder.run(), name="agenttune-serve-log")
            with _signals_set(stop):
                if ready is not None:
                    ready(gateway.base_url)
                await stop.wait()
            flushing.cancel()
            recorder.flush()
    finally:
        await engine.aclose()


@contextlib.contextmanager
def _signals_set(stop: asyncio.Event):
    """Ctrl-C and SIGTERM end the server cleanly (the log is written) instead of killing it."""
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(signum, stop.set)
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
