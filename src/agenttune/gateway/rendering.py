"""The model's chat template, rendered and tokenized the way the gateway needs it.

Besides rendering a whole conversation, the renderer answers the timeline's question: *given the
token ids the model already saw and generated, which ids do the new messages add — and may they be
added at all?* (`continuation`): it renders the conversation with the model's reply wrapped in
sentinels, once as it stood when the reply was generated (the reply last) and once with the new
messages after it. The text after the closing sentinel is the template's glue (e.g. end of turn and
newline) followed by the new messages and the next generation prompt; it may only be appended when
the template wrote everything up to the reply's end the same way both times (templates look ahead:
Qwen3 drops earlier turns' reasoning once a user speaks again, Mistral moves the tool list before the
last user turn).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from agenttune.errors import UserError
from agenttune.gateway.api_errors import GatewayError, bad_request

# Invisible separators around the reply's content: never in real text, and templates copy them as they are.
REPLY_START = "\u2063agenttune-reply\u2063"
REPLY_END = "\u2063agenttune-reply-end\u2063"
PIECE_CACHE_BYTES = 64 * 2**20  # the tokenized pieces kept, counted as their text's and ids' size
LARGEST_CACHED_PIECE = 256 * 1024  # characters; a longer piece (a pasted document) is rarely sent twice


@dataclass(frozen=True)
class Continuation:
    """What follows the model's reply when the new messages are added, or why they cannot be."""

    text: str | None  # glue + new messages + generation prompt; None when `problem` is set
    problem: str | None = None  # a timeline break reason


class ChatRenderer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._templates = _templates(tokenizer)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._globals = {
            name: getattr(tokenizer, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        self.special_ids = _special_ids(tokenizer)
        self._split_ids = _splitting_tokens(tokenizer) if self._backend is not None else {}
        self._splitter = re.compile("(" + "|".join(map(re.escape, sorted(self._split_ids, key=len, reverse=True)))
                                    + ")") if self._split_ids else None
        self._pieces = PieceCache(self._encode_piece, PIECE_CACHE_BYTES, LARGEST_CACHED_PIECE)
        # The longest token's text: N characters are at least N / this many tokens (a bound that needs no
        # tokenizing; None when the tokenizer cannot list its vocabulary).
        self.max_token_chars = _longest_token(tokenizer)
        self._token_text = lru_cache(maxsize=65536)(lambda token: tokenizer.decode([token], skip_special_tokens=False))
        # The Rust decoder directly, unless the Python wrapper would post-process the text.
        self._fast_decode = self._backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False)

    # -- rendering -----------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
               add_generation_prompt: bool, template_kwargs: dict[str, Any] | None = None) -> str:
        template = self._templates["tool_use" if tools and "tool_use" in self._templates else "default"]
        try:
            return template.render(
                messages=[_for_template(message) for message in messages], tools=tools or None,
                documents=None, add_generation_prompt=add_generation_prompt,
                **self._globals, **(template_kwargs or {}),
            )
        except Exception as error:  # the template refused these messages (raise_exception, bad order, ...)
            raise bad_request(f"The model's chat template cannot render these messages: {error}",
                              param="messages") from error

    def continuation(self, history: list[dict[str, Any]], reply: dict[str, Any], new: list[dict[str, Any]],
                     tools: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> Continuation:
        """The text the template writes after the model's reply in `history + [reply] + new`.

        The reply's content is wrapped in sentinels (its reasoning kept, which templates such as
        Qwen3's look at; its tool calls left out, since the model wrote them itself). Rendered with
        the reply last (as when it was generated) and with `new` after it, the text up to the
        closing sentinel must be the same, and the content between the sentinels untouched;
        otherwise the template rewrote the history (`template_rewrote_history`) or the reply
        (`template_rewrote_reply`) and the engine's ids would no longer be what the template renders.
        """
        stand_in = {"role": "assistant", "content": REPLY_START + (reply.get("content") or "") + REPLY_END}
        if reply.get("reasoning_content"):
            stand_in["reasoning_content"] = reply["reasoning_content"]
        try:
            now = self.render([*history, stand_in, *new], tools, add_generation_prompt=True,
                              template_kwargs=template_kwargs)
            then = self.render([*history, stand_in], tools, add_generation_prompt=False,
                               template_kwargs=template_kwargs)
        except GatewayError:
            return Continuation(None, "template_unsupported")
        end_now, end_then = _reply_end(now, stand_in["content"]), _reply_end(then, stand_in["content"])
        if end_now is None:
            return Continuation(None, "template_rewrote_reply")
        if end_then is None or now[:end_now] != then[:end_then] or not now.startswith(then[end_then:], end_now):
            return Continuation(None, "template_rewrote_history")
        return Continuation(now[end_now:])

    # -- tokens --------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of rendered template text (its special tokens are in the text already).

        Tokenizers never merge across special tokens, so the text is tokenized piece by piece between
        them and the pieces are cached: the system prompt with its tools, repeated by every episode,
        is tokenized once.
        """
        if self._splitter is None:
            return self._encode_piece(text)
        ids: list[int] = []
        for index, piece in enumerate(self._splitter.split(text)):
            if index % 2:
                ids.append(self._split_ids[piece])
            elif piece:
                ids += self._pieces.get(piece)
        return ids

    def _encode_piece(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: list[int]) -> str:
        """The reply's text, as vLLM shows it (special tokens skipped)."""
        if self._fast_decode and self._backend is not None:
            return self._backend.decode(token_ids, skip_special_tokens=True)
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self._token_text(token_id)


class PieceCache:
    """Token ids of text pieces, the least recently used dropped beyond `budget` bytes (thread-safe:
    large prompts are tokenized in a thread). Counting bytes, not entries, keeps a client that sends
    huge pieces from filling memory: 4,096 entries of any size could hold gigabytes."""

    def __init__(self, encode: Any, budget: int, largest: int):
        self.encode, self.budget, self.largest = encode, budget, largest
        self.size = 0
        self._entries: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, piece: str) -> list[int]:
        ids = self._entries.get(piece)
        if ids is not None:  # the hot path, without the lock: each OrderedDict call is atomic
            try:
                self._entries.move_to_end(piece)
            except KeyError:  # (evicted by another thread meanwhile)
                pass
            return ids
        ids = self.encode(piece)
        if len(piece) <= self.largest:
            with self._lock:
                if piece not in self._entries:
                    self._entries[piece] = ids
                    self.size += _cost(piece, ids)
                while self.size > self.budget:
                    old, old_ids = self._entries.popitem(last=False)
                    self.size -= _cost(old, old_ids)
        return ids


def _cost(piece: str, ids: list[int]) -> int:
    return 4 * len(piece) + 8 * len(ids) + 200  # text (up to 4 bytes a character), ids, the entry itself


def _longest_token(tokenizer: Any) -> int | None:
    try:
        vocabulary = tokenizer.get_vocab()
    except Exception:  # (a tokenizer without a listable vocabulary: no cheap bound)
        return None
    return max(map(len, vocabulary), default=0) or None


def _reply_end(text: str, wrapped: str) -> int | None:
    """Where the wrapped reply ends in `text`, if the template wrote it once and unchanged."""
    at = text.find(wrapped)
    if at < 0 or text.find(REPLY_START, at + 1) >= 0:
        return None
    return at + len(wrapped)


def _splitting_tokens(tokenizer: Any) -> dict[str, int]:
    """Special tokens that split the text before normalisation (so pieces tokenize independently)."""
    tokens = {}
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        plain = not (token.normalized or token.lstrip or token.rstrip or token.single_word)
        if token.special and plain and token.content:
            tokens[token.content] = token_id
    return tokens


def _special_ids(tokenizer: Any) -> frozenset[int]:
    """Named special tokens plus added tokens flagged special (Qwen's <|im_start|> is only the latter)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(token_id for token_id, token in added.items() if getattr(token, "special", False))
    return frozenset(ids)


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it (and as vLLM hands it to them)."""
    if "reasoning_content" in message:  # some templates (gpt-oss) read reasoning as `thinking`
        message = {"thinking": message["reasoning_content"], **message}
    if "tool_calls" in message:  # templates expect arguments as objects, not JSON strings
        message = {**message, "tool_calls": [_arguments_as_object(call) for call in message["tool_calls"]]}
    return message


def _arguments_as_object(call: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = json.loads(call["function"]["arguments"])
    except (ValueError, TypeError):
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**call["function"], "arguments": arguments}}


def _templates(tokenizer: Any) -> dict[str, Any]:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise UserError("The tokenizer has no chat template, so the gateway cannot turn messages into a prompt.",
                        hint="Use a chat/instruct model, or set model.tokenizer to one with a chat_template.")
    named = template if isinstance(template, dict) else {"default": template}
    if "default" not in named:
        named = {"default": next(iter(named.values())), **named}
    return {name: _compile(source) for name, source in named.items()}


def _generation_tag() -> type:
    """`{% generation %}...{% endgeneration %}` (marks assistant text in some templates): render the body."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    return GenerationTag


def _sandbox() -> type:
    """Jinja's immutable sandbox, with a fast path for the plain dicts that messages and tools are.

    `message.role` in a template makes the sandbox try `getattr(message, "role")` first, which on a
    dict raises (and costs an exception) before it falls back to `message["role"]`. A plain dict has
    no attributes but the dict type's, so for any other name the lookup goes straight to the key,
    with the sandbox's answer (the value, or undefined).
    """
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    dict_attributes = frozenset(dir(dict))

    class ChatTemplateSandbox(ImmutableSandboxedEnvironment):
        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and attribute not in dict_attributes:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            if type(obj) is LoopContext and not attribute.startswith("_"):  # `loop.first`: always safe
                try:
                    return getattr(obj, attribute)
                except AttributeError:
                    return self.undefined(obj=obj, name=attribute)
            return super().getattr(obj, attribute)

    return ChatTemplateSandbox


def _compile(source: str) -> Any:
    """Compile like transformers' apply_chat_template: sandboxed, trimmed blocks, its tojson."""
    import jinja2
    from jinja2.ext import loopcontrols

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    plain = json.JSONEncoder(ensure_ascii=False)  # what templates ask for nearly always: made once

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        if not (ensure_ascii or indent is not None or separators is not None or sort_keys):
            return plain.encode(value)
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = _sandbox()(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _generation_tag()])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    template = environment.from_string(source)
    # Its globals are a ChainMap over the environment's, which every render copies key by key into
    # the new context; the same names in a plain dict copy several times faster.
    template.globals = dict(template.globals)
    return template
