"""The model's chat template, rendered and tokenized the way the gateway needs it.

Besides rendering a whole conversation, the renderer answers the timeline's question: *given the
token ids the model already saw and generated, which ids do the new messages add?* (`delta_text`).
It renders the previous conversation with a sentinel in place of the model's reply and the new
conversation the same way; the text after the sentinel is the template's glue (e.g. the end of turn
and newline) followed by the new messages and the next generation prompt.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agenttune.errors import UserError

SENTINEL = "\u2063agenttune-reply\u2063"  # invisible separator: never in real text, survives templates


class ChatRenderer:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._templates = _templates(tokenizer)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._globals = {
            name: getattr(tokenizer, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        self.special_ids = _special_ids(tokenizer)

    # -- rendering -----------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
               add_generation_prompt: bool, template_kwargs: dict[str, Any] | None = None) -> str:
        template = self._templates.get("tool_use" if tools and "tool_use" in self._templates else "default")
        try:
            return template.render(
                messages=[_with_thinking_alias(message) for message in messages], tools=tools or None,
                documents=None, add_generation_prompt=add_generation_prompt,
                **self._globals, **(template_kwargs or {}),
            )
        except Exception as error:  # the template refused these messages (raise_exception, bad order, ...)
            from agenttune.gateway.errors import bad_request

            raise bad_request(f"The model's chat template cannot render these messages: {error}",
                              param="messages") from error

    def delta_text(self, history: list[dict[str, Any]], new: list[dict[str, Any]], tools: list[dict[str, Any]],
                   template_kwargs: dict[str, Any]) -> tuple[str, str] | None:
        """(closing, added) text after the model's reply in `history + [reply] + new`.

        `closing` is what the template writes right after a reply (e.g. "<|im_end|>\\n"); `added`
        is the new messages plus the generation prompt. None: the template does not render the
        conversation append-only, so the ids cannot be reused.
        """
        with_reply = [*history, {"role": "assistant", "content": SENTINEL}]
        before = self.render(with_reply, tools, add_generation_prompt=False, template_kwargs=template_kwargs)
        after = self.render([*with_reply, *new], tools, add_generation_prompt=True, template_kwargs=template_kwargs)
        at = before.find(SENTINEL)
        if at < 0 or before.count(SENTINEL) != 1 or not after.startswith(before):
            return None
        return before[at + len(SENTINEL):], after[len(before):]

    # -- tokens --------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of rendered template text (its special tokens are in the text already)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _special_ids(tokenizer: Any) -> frozenset[int]:
    """Named special tokens plus added tokens flagged special (Qwen's <|im_start|> is only the latter)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(token_id for token_id, token in added.items() if getattr(token, "special", False))
    return frozenset(ids)


def _with_thinking_alias(message: dict[str, Any]) -> dict[str, Any]:
    # Some templates (gpt-oss) read reasoning as `thinking`; transformers passes both names.
    if "reasoning_content" in message:
        return {"thinking": message["reasoning_content"], **message}
    return message


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


def _compile(source: str) -> Any:
    """Compile like transformers' apply_chat_template: sandboxed, trimmed blocks, its tojson."""
    import json

    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[loopcontrols, _generation_tag()])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return environment.from_string(source)
