"""Grammar-constrained decoding for the `hf` engine, with xgrammar.

xgrammar was picked over llguidance by measured cost per decode step (bench/grammar_cost.py: on the
tiny model's tokenizer, a JSON schema costs 2.3-4.6 us per step to mask and advance with xgrammar
0.2.8 against 56-96 us with llguidance 1.9; xgrammar precomputes the masks of context-independent
tokens).

Per decode step, rows with a guide get their allowed tokens as a bitmask (filled on the CPU by each
row's matcher), the logits of every other token become -inf before temperature and sampling, and
the sampled token advances the matcher. A row where the grammar allowed a single token records it
as forced (not trained on).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from agenttune.components.engines.base import Guide, GuidedDecodingMissing, GuideError

# xgrammar is in its own extra, not in `local`: it requires triton (about 285 MB of GPU kernels), which
# a CPU machine that never guides a reply should not download.
MISSING = ("This request asks for tool_choice or response_format, which the hf engine enforces while decoding "
           "with xgrammar, and xgrammar is not installed here. It is in agenttune's `guided` extra (not in "
           "`local`, because it pulls triton, a GPU package): pip install 'agenttune[guided]', or send the "
           "request without tool_choice and response_format.")


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise GuidedDecodingMissing(MISSING) from None
    return xgrammar


# At most one whitespace character between JSON tokens: without a bound, a model unsure of the next
# key can pad with newlines and spaces until it runs out of tokens (the gateway's structural tags
# set the same bound).
MAX_WHITESPACE = 1


class GrammarBook:
    """Compiles guides for one tokenizer and vocabulary (cached), and masks a batch's logits."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]):
        self.tokenizer, self.vocab_size, self.stop_token_ids = tokenizer, vocab_size, stop_token_ids
        self._compiler: Any = None

    def matcher(self, guide: Guide) -> Any:
        """A fresh matcher for one request (its state: where in the grammar the reply is)."""
        return _xgrammar().GrammarMatcher(self._compiled(guide))

    @lru_cache(maxsize=256)  # noqa: B019 - one book per engine; a run sends a few distinct guides
    def _compiled(self, guide: Guide) -> Any:
        xgrammar = _xgrammar()
        if self._compiler is None:
            info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                           stop_token_ids=self.stop_token_ids)
            self._compiler = xgrammar.GrammarCompiler(info)
        try:
            if guide.kind == "json_schema":
                return self._compiler.compile_json_schema(guide.spec, strict_mode=False,
                                                          max_whitespace_cnt=MAX_WHITESPACE)
            return self._compiler.compile_structural_tag(guide.spec)
        except Exception as error:  # an unsupported schema: the request fails, the engine goes on
            raise GuideError(f"xgrammar could not compile it ({type(error).__name__}: {error})") from error

    def mask(self, logits: Any, matchers: list[Any]) -> Any:
        """Mask `logits` in place for the rows with a matcher; returns, per row, whether one token was allowed."""
        import torch

        xgrammar = _xgrammar()
        rows = [row for row, matcher in enumerate(matchers) if matcher is not None]
        bitmask = xgrammar.allocate_token_bitmask(len(matchers), self.vocab_size)
        for row in rows:
            matchers[row].fill_next_token_bitmask(bitmask, row)
        xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab_size,
                                             indices=rows)
        allowed = torch.isfinite(logits).sum(dim=-1)
        return allowed == 1


def advance(matchers: list[Any], tokens: list[int]) -> None:
    """Feed each row's sampled token to its matcher (the grammar moves on)."""
    for matcher, token in zip(matchers, tokens, strict=True):
        if matcher is not None and not matcher.is_terminated():
            matcher.accept_token(token)
