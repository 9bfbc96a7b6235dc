"""One agent's calls in one episode, merged into training samples with exact token ids.

When a request's messages are the previous request's messages plus the reply the model generated
plus new messages (tool results, a user turn), its prompt is the previous prompt ids + the generated
ids + the template glue and new messages tokenized on their own (the delta). Nothing generated is
re-tokenized. Such calls merge into one sample whose loss mask is 1 exactly on generated tokens (not
on those a grammar forced), and whose `call_spans` record where each call's reply lies: the
boundaries that splitting a sample keeps.
Otherwise a new sample starts and the reason is counted (`BREAK_REASONS`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agenttune.gateway.protocol import ChatRequest
from agenttune.gateway.rendering import ChatRenderer
from agenttune.workflow.episode import Sample

BREAK_REASONS = {
    "tools_changed": "the request offered different tools than the previous one",
    "template_kwargs_changed": "chat_template_kwargs differ from the previous request",
    "history_rewritten": "the earlier messages differ (compressed, edited, or another conversation)",
    "repeated_request": "the same messages were sent again (a retry or a resample)",
    "reply_missing": "the message after the previous history is not the model's reply",
    "reply_modified": "the model's reply came back changed",
    "dropped_thinking": "the model's reply came back without its reasoning",
    "no_new_messages": "nothing follows the model's reply",
    "template_unsupported": "the chat template could not render the continuation around the reply",
    "template_rewrote_history": "the chat template renders the earlier turns differently once the new messages "
                                "follow (e.g. it drops their reasoning, or moves the tool list)",
    "template_rewrote_reply": "the chat template renders the model's reply differently than it was generated "
                              "(e.g. it strips a think block left in the content)",
    "concurrent_call": "another call of the same agent was still running",
    "policy_changed": "the call samples with another policy's adapter (`agenttune serve`: another `model`)",
}


@dataclass
class SampleBuilder:
    agent: str
    prompt_ids: list[int]
    policy: str | None = None  # the adapter that sampled it (several policies); None: the one model
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    call_spans: list[tuple[int, int]] = field(default_factory=list)  # each call's reply in response_ids
    exact: bool = True  # False: built from text, not from the engine's token ids
    engine_logprobs: bool = True  # False: the engine reported none (placeholders; the trainer recomputes)
    versions: list[int] | None = None  # per response token, once an engine reported versions

    def add_context(self, token_ids: list[int]) -> None:
        self.response_ids += token_ids
        self.loss_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        if self.versions is not None:
            self.versions += [-1] * len(token_ids)

    def add_generated(self, token_ids: list[int], logprobs: list[float] | None,
                      forced: list[bool] | None = None, versions: list[int] | None = None) -> None:
        """`forced`: tokens a grammar allowed alone (not the model's choice): loss mask 0, kept as context.
        `versions`: the policy version of each token (asynchronous training)."""
        if versions is not None and self.versions is None:
            self.versions = [-1] * len(self.response_ids)
        if self.versions is not None:
            self.versions += list(versions) if versions is not None else [-1] * len(token_ids)
        self.call_spans.append((len(self.response_ids), len(self.response_ids) + len(token_ids)))
        self.response_ids += token_ids
        self.loss_mask += [0 if is_forced else 1 for is_forced in forced] if forced else [1] * len(token_ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(token_ids)
        self.engine_logprobs = self.engine_logprobs and logprobs is not None

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def to_sample(self, trainable: bool) -> Sample:
        return Sample(agent=self.agent, policy=self.policy, prompt_ids=list(self.prompt_ids), response_ids=list(self.response_ids),
                      loss_mask=list(self.loss_mask), logprobs=list(self.logprobs), num_calls=len(self.call_spans),
                      call_spans=list(self.call_spans),
                      trainable=trainable and self.exact, engine_logprobs=self.engine_logprobs,
                      policy_versions=list(self.versions) if self.versions is not None else None)


@dataclass
class Prompt:
    """The ids to generate from, and how they relate to the timeline."""

    ids: list[int]
    extends: SampleBuilder | None = None  # the sample this call continues
    extends_at: int = 0  # that sample's length when this prompt was made
    context_ids: list[int] = field(default_factory=list)  # glue + new messages, when extending
    break_reason: str | None = None  # why it does not continue the previous call


@dataclass
class _Turn:
    """What the previous call left for the next one to extend."""

    messages: list[dict[str, Any]]
    reply: dict[str, Any]
    tools: list[dict[str, Any]]
    template_kwargs: dict[str, Any]
    stop_token: int | None  # the last generated id, when it was a stop token


class Timeline:
    def __init__(self, agent: str, renderer: ChatRenderer, samples: list[SampleBuilder]):
        self.agent = agent
        self.renderer = renderer
        self.samples = samples  # shared with the channel: every agent's samples in creation order
        self.current: SampleBuilder | None = None
        self.breaks: Counter[str] = Counter()
        self.conversation: list[dict[str, Any]] = []
        self.in_flight = 0
        self.calls = 0  # answered calls (rollout.max_turns bounds them)
        self.policy: str | None = None  # the policy whose adapter samples this agent's calls (gateway routing)
        self._turn: _Turn | None = None

    def prompt_for(self, request: ChatRequest) -> Prompt:
        """The prompt ids for `request`: an extension of the current sample when possible."""
        reason = None if self._turn is None else self._break_reason(request)
        if self._turn is not None and reason is None:
            prompt, reason = self._extension(request)
            if prompt is not None:
                return prompt
        text = self.renderer.render(request.messages, request.tools, add_generation_prompt=True,
                                    template_kwargs=request.template_kwargs)
        return Prompt(self.renderer.encode(text), break_reason=reason)

    def _extension(self, request: ChatRequest) -> tuple[Prompt | None, str | None]:
        turn, sample = self._turn, self.current
        assert turn is not None and sample is not None  # prompt_for calls this only after a call was recorded
        new_messages = request.messages[len(turn.messages) + 1:]
        continuation = self.renderer.continuation(turn.messages, turn.reply, new_messages, request.tools,
                                                  request.template_kwargs)
        text = continuation.text
        if text is None:
            return None, continuation.problem
        if turn.stop_token is not None:  # the model already wrote the end of its turn itself
            stop_text = self.renderer.token_text(turn.stop_token)
            if text.startswith(stop_text):
                text = text[len(stop_text):]
        context_ids = self.renderer.encode(text)
        return Prompt(sample.context_ids + context_ids, sample, sample.length, context_ids), None

    def record(self, request: ChatRequest, prompt: Prompt, token_ids: list[int], logprobs: list[float] | None,
               reply: dict[str, Any], *, exact: bool, stop_token: int | None, extendable: bool = True,
               forced: list[bool] | None = None, versions: list[int] | None = None) -> None:
        """File a finished call: extend the current sample or start a new one.

        `exact`: the ids are the engine's; `extendable`: a later call may continue this one.
        """
        if prompt.extends is not None and prompt.extends.length == prompt.extends_at:
            sample = prompt.extends  # (unchanged since the prompt was made, even if calls overlapped)
            sample.add_context(prompt.context_ids)
            self.current = sample
        else:
            sample = SampleBuilder(self.agent, list(prompt.ids), self.policy, exact=exact)
            self.samples.append(sample)
            self.current = sample
            reason = prompt.break_reason or ("concurrent_call" if prompt.extends is not None else None)
            if reason:
                self.breaks[reason] += 1
        sample.add_generated(token_ids, logprobs, forced, versions)
        self.calls += 1
        self.conversation = [*request.messages, reply]
        self._turn = None
        if exact and extendable:
            self._turn = _Turn(request.messages, reply, request.tools, request.template_kwargs, stop_token)

    def _break_reason(self, request: ChatRequest) -> str | None:
        """Why `request` cannot extend the previous call; None when it can."""
        turn = self._turn
        assert turn is not None  # prompt_for asks only when there is a previous call
        if self.in_flight > 1:
            return "concurrent_call"
        if self.current is not None and self.current.policy != self.policy:
            return "policy_changed"  # a sample is one policy's: its logprobs are that adapter's
        if request.tools != turn.tools:
            return "tools_changed"
        if request.template_kwargs != turn.template_kwargs:
            return "template_kwargs_changed"
        history, messages = turn.messages, request.messages
        if messages == history:
            return "repeated_request"
        if len(messages) <= len(history) or messages[: len(history)] != history:
            return "history_rewritten"
        reply_problem = _reply_difference(turn.reply, messages[len(history)])
        if reply_problem:
            return reply_problem
        if len(messages) == len(history) + 1:
            return "no_new_messages"
        return None


def _reply_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    if theirs.get("role") != "assistant":
        return "reply_missing"
    if (theirs.get("content") or "") != (ours.get("content") or ""):
        return "reply_modified"
    if not _same_calls(theirs, ours):
        return "reply_modified"
    our_reasoning, their_reasoning = ours.get("reasoning_content"), theirs.get("reasoning_content")
    if our_reasoning and not their_reasoning:
        return "dropped_thinking"
    if (their_reasoning or None) != (our_reasoning or None):
        return "reply_modified"
    return None


def _same_calls(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Whether the tool calls are ours: sent back as they were, or with the arguments re-serialised."""
    return _calls_text(theirs) == _calls_text(ours) or _calls_key(theirs) == _calls_key(ours)


def _calls_text(message: dict[str, Any]) -> list[tuple[str, str]]:
    return [(call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls") or []]


def _calls_key(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """Tool calls compared by name and parsed arguments (clients re-serialise JSON their own way)."""
    key = []
    for call in message.get("tool_calls") or []:
        arguments = call["function"]["arguments"]
        try:
            arguments = json.dumps(json.loads(arguments), sort_keys=True)
        except ValueError:
            pass
        key.append((call["function"]["name"], arguments))
    return key
