"""When a generation stops: stop tokens, stop strings, token budgets."""

from __future__ import annotations

from typing import Any

# Decoding this many extra tokens beyond the longest stop string covers tokens that decode to
# nothing on their own (parts of a multi-byte character).
_SPARE_TOKENS = 8


class StopStrings:
    """Finds the user's stop strings in the tail of a growing generation, without decoding all of it."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stop = tuple(text for text in stop if text)
        self.window = max((len(text) for text in self.stop), default=0) + _SPARE_TOKENS

    def __bool__(self) -> bool:
        return bool(self.stop)

    def hit(self, token_ids: list[int]) -> bool:
        """Whether the generation now contains a stop string that its last token completed."""
        if not self.stop:
            return False
        tail = self.tokenizer.decode(token_ids[-self.window:], skip_special_tokens=False)
        return any(text in tail for text in self.stop)


def stop_token_set(sampling_ids: tuple[int, ...], *extra: int | list[int] | None) -> frozenset[int]:
    """The request's stop token ids plus the model's end-of-sequence ids."""
    ids = set(sampling_ids)
    for item in extra:
        if isinstance(item, int):
            ids.add(item)
        elif item:
            ids.update(item)
    return frozenset(ids)
