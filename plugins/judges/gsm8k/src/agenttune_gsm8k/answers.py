"""Reading answers out of text, strictly: `\\boxed{...}` and `#### N`, and plain number comparison.

This is the judge's fallback when math-verify cannot decide (it timed out, or parsed nothing), and
the source of the format-compliance metric. "Strict" means: an answer counts only when it is marked
(boxed or after `####`); no guessing at "the last number in the text".
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Literal

AnswerFormat = Literal["boxed", "hash"]

BOXED_OPENERS = ("\\boxed{", "\\fbox{")
HASH_LINE = re.compile(r"####\s*([^\n]*)")
# Decorations around a number that do not change its value: currency, thousands separators, spacing.
NUMBER_NOISE = re.compile(r"\\\$|\$|\\,|\\!|\\ |,|\s|\\left|\\right")
TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
FRAC = re.compile(r"^(-?)\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")
PLAIN_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)(/\d+)?$")


def boxed_contents(text: str) -> list[str]:
    """The contents of every `\\boxed{...}` (and `\\fbox{...}`), braces balanced, in order."""
    found: list[str] = []
    index = 0
    while True:
        starts = [(text.find(opener, index), opener) for opener in BOXED_OPENERS]
        starts = [(start, opener) for start, opener in starts if start >= 0]
        if not starts:
            return found
        start, opener = min(starts)
        depth, position = 1, start + len(opener)
        while position < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            position += 1
        if depth:  # unbalanced: not an answer
            return found
        found.append(text[start + len(opener): position - 1].strip())
        index = position


def hash_answers(text: str) -> list[str]:
    """The text after every `####` marker (to the end of its line), in order."""
    return [match.strip().rstrip(".") for match in HASH_LINE.findall(text) if match.strip()]


def strict_answer(text: str) -> tuple[str | None, AnswerFormat | None]:
    """The marked answer and how it was marked: the last `\\boxed{}`, else the last `#### N`."""
    boxed = boxed_contents(text)
    if boxed:
        return boxed[-1], "boxed"
    hashed = hash_answers(text)
    if hashed:
        return hashed[-1], "hash"
    return None, None


def number_value(text: str) -> Fraction | None:
    """The exact value of a plain number written in any of the usual ways, else None.

    Accepts `1,234`, `$1,234.50`, `\\$5`, `3/4`, `\\frac{3}{4}`, `-0.5`, `72.`, `\\text{72}`, a trailing
    `%` is kept as part of the number (25% -> 25) since GSM8K golds are written without it.
    """
    cleaned = TEXT_WRAPPER.sub(r"\1", text.strip())
    cleaned = NUMBER_NOISE.sub("", cleaned).rstrip(".").removesuffix("\\%").removesuffix("%")
    fraction = FRAC.match(cleaned)
    if fraction:
        sign, numerator, denominator = fraction.groups()
        cleaned = f"{sign}{numerator}/{denominator}"
    if not PLAIN_NUMBER.match(cleaned):
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def same_answer(gold: str, answer: str) -> bool:
    """Equal as numbers when both are numbers, else equal as whitespace-normalised text."""
    gold_value, answer_value = number_value(gold), number_value(answer)
    if gold_value is not None and answer_value is not None:
        return gold_value == answer_value
    return " ".join(gold.split()) == " ".join(answer.split())


def ground_truth(metadata: dict[str, Any], key: str | None = None) -> str | None:
    """The reference answer of a task: `metadata[key]`, else `ground_truth`, else GSM8K's `answer`.

    A GSM8K `answer` is a worked solution ending in `#### 72`: only the part after the last `####`
    is the answer. A `ground_truth` that still carries the marker is cut the same way.
    """
    for name in [key] if key else ["ground_truth", "answer"]:
        value = metadata.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        text = str(value)
        if "####" in text:
            text = text.rsplit("####", 1)[1]
        return text.strip()
    return None


def answer_text(value: Any) -> str:
    """The final answer a workflow handed over, as text (numbers and `{"result": ...}` included)."""
    if isinstance(value, dict):
        for key in ("result", "answer", "final_answer"):
            if key in value:
                return answer_text(value[key])
    return "" if value is None else str(value)
