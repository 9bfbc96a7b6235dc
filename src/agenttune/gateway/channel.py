"""`EpisodeChannel`: one episode's door into the gateway, and its record.

The rollout engine opens a channel per episode; the workflow's clients reach it with the channel's
key (over HTTP or an in-process transport); afterwards the channel hands over the episode's
samples, conversation and counters.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agenttune.components.engines.base import SamplingParams
from agenttune.gateway.reply import RequestHandler
from agenttune.gateway.timeline import BREAK_REASONS, SampleBuilder, Timeline
from agenttune.workflow.episode import Sample

if TYPE_CHECKING:
    from agenttune.gateway.rendering import ChatRenderer
    from agenttune.gateway.transport import AsyncInProcessTransport, InProcessTransport

DEFAULT_AGENT = "default"
# What an agent name (the `KEY.agent` suffix of an API key) may be: it is stored with the samples,
# shown in the log viewer and used in metric names, so no path separators, controls or bidi marks.
AGENT_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,64}")
AGENT_NAME_RULE = "1-64 letters, digits or _ . : @ + -"


class ChannelHost(RequestHandler, Protocol):
    """What a channel needs from the gateway that opened it (`agenttune.gateway.Gateway`): its
    addresses, its renderer, and its request handler for the in-process transports. A Protocol, so
    that the channel does not import the server, which imports the channel."""

    @property
    def base_url(self) -> str: ...

    @property
    def root_url(self) -> str: ...

    @property
    def renderer(self) -> ChatRenderer: ...


@dataclass
class EpisodeRecord:
    """What an episode's channel hands over when the episode ends (it may cross a process boundary)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    trainable: bool = True
    madness: list[str] = field(default_factory=list)
    engine_failing: bool = False


class EpisodeChannel:
    """One episode's door into the gateway (its key and addresses) and its record."""

    def __init__(self, gateway: ChannelHost, episode_id: str, key: str, sampling: SamplingParams):
        self.gateway = gateway
        self.episode_id = episode_id
        self.key = key
        self.sampling = sampling
        self.context_overflow = False
        self.turn_limit = False  # an agent asked for more than rollout.max_turns calls (refused)
        self.trainable = True  # False once the engine answered with text instead of token ids
        self.engine_failing = False  # the latest call failed in the inference engine (a 502)
        self.madness: list[str] = []  # the checks that fired, in order, each once
        self.madness_details: list[str] = []  # what each hit was about
        self.counters: Counter[str] = Counter()
        self.closed = False
        self._timelines: dict[str, Timeline] = {}
        self._samples: list[SampleBuilder] = []

    # -- addresses -------------------------------------------------------------------------------
    def api_key(self, agent: str | None = None) -> str:
        """The API key a client sends: the episode key, or `key.agent` to file calls under `agent`."""
        if agent in (None, DEFAULT_AGENT):
            return self.key
        if not AGENT_NAME.fullmatch(agent):
            raise ValueError(f"The agent name {agent!r} is not {AGENT_NAME_RULE} (the gateway would refuse "
                             "its calls): name agents like 'solver' or 'critic-2'.")
        return f"{self.key}.{agent}"

    @property
    def base_url(self) -> str:
        """The gateway's OpenAI base URL (`http://127.0.0.1:PORT/v1`); send `api_key()` with it."""
        return self.gateway.base_url

    def path_base_url(self, agent: str | None = None) -> str:
        """A base URL with the key in the path, for clients that cannot set an API key."""
        return f"{self.gateway.root_url}/e/{self.api_key(agent)}/v1"

    def transport(self) -> InProcessTransport:
        """An `httpx` transport that reaches the gateway without a socket (sync clients)."""
        from agenttune.gateway.transport import InProcessTransport  # (httpx loads on first use)

        return InProcessTransport(self.gateway)

    def async_transport(self) -> AsyncInProcessTransport:
        """An `httpx` transport that reaches the gateway without a socket (async clients)."""
        from agenttune.gateway.transport import AsyncInProcessTransport

        return AsyncInProcessTransport(self.gateway)

    # -- the record --------------------------------------------------------------------------------
    def timeline(self, agent: str) -> Timeline:
        if agent not in self._timelines:
            self._timelines[agent] = Timeline(agent, self.gateway.renderer, self._samples)
        return self._timelines[agent]

    def samples(self, trainable_targets: list[str] | None = None) -> list[Sample]:
        """Every agent's samples in the order they started; `trainable_targets` picks whose are trained."""
        return [sample.to_sample(self.trainable and (trainable_targets is None or sample.agent in trainable_targets))
                for sample in self._samples]

    def messages(self, agent: str | None = None) -> list[dict[str, Any]]:
        """The conversation: the last request's messages plus the reply (every agent's, in order)."""
        if agent is not None:
            timeline = self._timelines.get(agent)
            return list(timeline.conversation) if timeline else []
        messages: list[dict[str, Any]] = []
        for name, timeline in self._timelines.items():
            messages += [{**message, "name": name} if name != DEFAULT_AGENT and message["role"] == "assistant"
                         else message for message in timeline.conversation]
        return messages

    def record(self, trainable_targets: list[str] | None = None) -> EpisodeRecord:
        """The episode so far: conversation, samples (see `samples`), counters and flags."""
        return EpisodeRecord(self.messages(), self.samples(trainable_targets), self.metrics(), self.trainable,
                             list(self.madness), self.engine_failing)

    def metrics(self) -> dict[str, float]:
        """Counters of this episode: calls, tokens, samples, merge breaks (by reason), madness, overflow."""
        breaks: Counter[str] = Counter()
        for timeline in self._timelines.values():
            breaks.update(timeline.breaks)
        metrics: dict[str, float] = {name: 0.0 for name in ("calls", "prompt_tokens", "generated_tokens",
                                                            "tool_calls", "tool_call_errors", "engine_errors",
                                                            "context_overflow", "turn_limit")}
        metrics.update({name: float(value) for name, value in self.counters.items()})
        metrics["samples"] = float(len(self._samples))
        metrics["merge_breaks"] = float(sum(breaks.values()))
        metrics.update({f"merge_break/{reason}": float(count) for reason, count in breaks.items()})
        for check in self.madness:
            metrics[f"madness/{check}"] = 1.0
        return metrics

    def flag_madness(self, check: str, detail: str) -> None:
        if check not in self.madness:
            self.madness.append(check)
        self.madness_details.append(f"{check}: {detail}")


__all__ = ["ChannelHost", "EpisodeChannel", "EpisodeRecord", "BREAK_REASONS", "DEFAULT_AGENT"]
