"""The LLM gateway: OpenAI-compatible chat completions with exact token capture (see docs/gateway.md)."""

from agenttune.gateway.channel import EpisodeChannel
from agenttune.gateway.server import Gateway

__all__ = ["Gateway", "EpisodeChannel"]
