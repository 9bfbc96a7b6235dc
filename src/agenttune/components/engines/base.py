"""The inference-engine contract: token ids in, token ids and logprobs out."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from agenttune.config.base import Component

FinishReason = Literal["stop", "length", "abort"]


GuideKind = Literal["json_schema", "structural_tag"]


@dataclass(frozen=True)
class Guide:
    """A grammar the reply must follow, enforced while decoding (tool_choice, response_format).

    `kind` is `json_schema` (`spec`: the schema as JSON text) or `structural_tag` (`spec`: an
    xgrammar/vLLM structural tag as JSON text: tagged tool calls with JSON-schema arguments).
    Engines with `enforces_guides` mask the logits so that only tokens the grammar allows can be
    sampled; the logprobs they report are those of the masked distribution (what was sampled from).
    """

    kind: GuideKind
    spec: str


class GuideError(ValueError):
    """The engine cannot build the grammar of a request's guide (e.g. a JSON-schema feature it lacks)."""

    def refusal(self) -> str:
        """What the gateway answers (400): the request's guide, not the engine, is at fault."""
        return f"The response_format or tool parameters schema cannot be enforced: {self}. Simplify the schema."


class GuidedDecodingMissing(GuideError):
    """The engine enforces guides with a library that is not installed here (an optional extra)."""

    def refusal(self) -> str:
        return str(self)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    guide: Guide | None = None
    # Lower first, when requests wait for room in a batch (`hf`; other engines ignore it). Asynchronous
    # training gives each group its admission number: the group the trainer takes next decodes first.
    priority: int = 0
    # The LoRA adapter (policy) that samples this request, when the run has several (config/policies.py);
    # None: the model as it is. Engines whose `adapter_names` lists none ignore it.
    adapter: str | None = None


@dataclass
class Generation:
    """What an engine returns for one request.

    `token_ids` are the generated ids exactly as sampled (the truth that is trained on);
    `logprobs[i]` is the sampling logprob of `token_ids[i]`, or None when the engine cannot report it.
    `text` is only set by engines that cannot return ids (then the episode is not trainable).
    `forced[i]` is True where a guide allowed only `token_ids[i]`: it was not a choice of the model,
    so it is not trained on (loss mask 0). None: nothing was forced.
    `versions[i]` is the policy version (optimizer updates applied to the weights) that sampled
    `token_ids[i]`: a weight update can land mid-generation in asynchronous training. None: the engine
    does not track versions.
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    text: str | None = None
    metadata: dict[str, object] = field(default_factory=dict)
    forced: list[bool] | None = None
    versions: list[int] | None = None


class InferenceEngine(Component):
    """Generates continuations of prompt token ids.

    `name` is the config's `engine.type`; `Options` validates the rest of the `engine:` section.
    Implementations must be safe to call concurrently from one event loop; engines that batch
    collect concurrent calls into one forward pass. `returns_token_ids` is False for engines that
    only see text (their episodes are marked not trainable); `returns_logprobs` is False for engines
    that cannot report the sampled tokens' logprobs (the gateway checks the others' on every call).
    """

    returns_token_ids: ClassVar[bool] = True
    wants_messages: bool = False  # True: the gateway calls generate_chat (the server renders the prompt)
    # False: the engine never reports logprobs; its samples say so and the trainer recomputes them.
    # True: every generation must carry one finite logprob per token, or the gateway refuses it.
    returns_logprobs: ClassVar[bool] = True
    # True: `SamplingParams.guide` is enforced while decoding. False: the gateway counts the request
    # as `guide_not_enforced` and the reply may break the grammar.
    enforces_guides: ClassVar[bool] = False
    # True: `sync_weights` may run while requests are in flight (the update lands between two decode
    # steps) and generations report per-token `versions`: what asynchronous training needs.
    updates_weights: ClassVar[bool] = False
    # True: the engine samples from a copy of the weights it holds itself (vllm: in its own process),
    # which `sync_weights` fills from the trainer's model; asynchronous training hands it the trained
    # model. False: it samples from the model object it is given (hf), so asynchronous training gives
    # it a frozen copy of the policy.
    copies_weights: ClassVar[bool] = False
    # True: `prompt_logprobs` scores given token ids (an on-policy distillation teacher; `agenttune
    # serve`'s /v1/completions with `echo` or `prompt_logprobs`).
    scores_prompts: ClassVar[bool] = False

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The LoRA adapters (policies) this engine serves at once, by `SamplingParams.adapter`; () for none."""
        return ()

    @classmethod
    def from_config(cls, config: Any, options: Any, tokenizer: Any, *, model: Any = None) -> InferenceEngine:
        """Build the engine for a run (`agenttune.registry.resolution.build_engine` calls this).

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

    async def generate_stream(self, prompt_ids: list[int], sampling: SamplingParams, *,
                              request_id: str | None = None) -> AsyncGenerator[list[int] | Generation, None]:
        """The generation as it happens: lists of newly sampled token ids, then the finished `Generation`.

        The ids streamed add up to the Generation's `token_ids`. Closing the iterator early abandons
        the request. This default streams nothing until the end (engines that cannot stream).
        """
        yield await self.generate(prompt_ids, sampling, request_id=request_id)

    async def release_memory(self) -> None:
        """Before a training update: free what the engine holds on the accelerator.

        For engines with their own copy of the weights on the trainer's GPU (`vllm`: sleep mode).
        Synchronous training only: asynchronous modes do not call it (the engine generates during
        the update). Default: nothing (engines that share the trainer's model object, or run elsewhere).
        """

    async def sync_weights(self, model: Any, version: int = 0) -> None:
        """After a training update: sample from `model`'s new weights, as policy `version`, from now on.

        Engines with `updates_weights` take them while requests are in flight (those go on with the
        new weights at their next token, and generations report per-token `versions`); `version` is
        what their tokens record from then on. Default: nothing (an engine that cannot hold weights
        of its own).
        """

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token_ids[i] | token_ids[:i]) for i = 1 .. len-1, at temperature 1 (the model's own
        distribution): what vLLM's `prompt_logprobs` returns, without its leading None."""
        raise NotImplementedError(f"the {self.name!r} engine cannot score prompts (scores_prompts is False)")

    def counters(self) -> dict[str, float]:
        """Running totals since the engine started, for monitoring: the local backbone logs each
        step's share as `engine/*` metrics (docs/local.md). Engines that count nothing return {}.
        `hf`: batches, decode_steps, rows_decoded, rows_in_flight, decode_s, decode_cpu_s, prefilled_rows,
        joined, columns (the KV-cache width of each decode step, summed), trimmed_columns, graph_steps,
        graph_captures."""
        return {}

    async def aclose(self) -> None:
        """Release servers, threads and memory."""
