"""The inference-engine contract: token ids in, token ids and logprobs out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from agenttune.judge import NoOptions

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass
class Generation:
    """What an engine returns for one request.

    `token_ids` are the generated ids exactly as sampled (the truth that is trained on);
    `logprobs[i]` is the sampling logprob of `token_ids[i]`, or None when the engine cannot report it.
    `text` is only set by engines that cannot return ids (then the episode is not trainable).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    text: str | None = None
    metadata: dict[str, object] = field(default_factory=dict)


class InferenceEngine:
    """Generates continuations of prompt token ids.

    `name` is the config's `engine.type`; `Options` validates the rest of the `engine:` section.
    Implementations must be safe to call concurrently from one event loop; engines that batch
    collect concurrent calls into one forward pass. `returns_token_ids` is False for engines that
    only see text (their episodes are marked not trainable).
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = NoOptions
    returns_token_ids: ClassVar[bool] = True
    wants_messages: bool = False  # True: the gateway calls generate_chat (the server renders the prompt)

    @classmethod
    def from_config(cls, config: Any, options: Any, tokenizer: Any, *, model: Any = None) -> InferenceEngine:
        """Build the engine for a run (`agenttune.engines.build_engine` calls this).

        `options` is the validated `engine:` section (an instance of `cls.Options`, so subclasses
        annotate it with their own model); `model` is an already-loaded model to share with a
        trainer, for engines that can use one.
        """
        return cls()

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement generate()")

    async def generate_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> tuple[Generation, list[int] | None]:  # pragma: no cover - only engines with wants_messages
        """Generate from chat messages; returns the generation and the prompt ids, when the server sends them."""
        raise NotImplementedError(f"{type(self).__name__} sets wants_messages but has no generate_chat()")

    async def aclose(self) -> None:
        """Release servers, threads and memory."""
