"""The GAIA reward: the answer inside <answer>...</answer>, compared the way GAIA's scorer does.

`gaia_reward_func(data_source, solution_str, ground_truth, extra_info)` has AWorld Train's (and
verl's) reward-function signature: 1.0 when the extracted answer matches the ground truth, else 0.0.

Matching, after the answer is extracted:
- a numeric ground truth: the answer as a number ("$1,330", "42%", " 3.0 " all read as numbers);
- a list ground truth (with "," or ";"): the same number of items, each matching as a number or a string;
- otherwise: strings equal after lower-casing and dropping whitespace and punctuation.
"""

from __future__ import annotations

import re
import string
from typing import Any

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
LIST_SEPARATORS = re.compile(r"[,;]")


def gaia_reward_func(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    answer = extract_answer(solution_str)
    if answer is None or ground_truth is None:
        return 0.0
    return 1.0 if answers_match(answer, str(ground_truth)) else 0.0


def extract_answer(text: str) -> str | None:
    """The last <answer>...</answer> in `text`, stripped; None when there is none."""
    found = ANSWER.findall(text or "")
    return found[-1].strip() if found else None


def answers_match(answer: str, truth: str) -> bool:
    if as_number(truth) is not None:
        return _numbers_match(answer, truth)
    if LIST_SEPARATORS.search(truth):
        answers, truths = _items(answer), _items(truth)
        return len(answers) == len(truths) and all(
            _numbers_match(a, t) if as_number(t) is not None else normalized(a, keep_punctuation=True) ==
            normalized(t, keep_punctuation=True) for a, t in zip(answers, truths, strict=True))
    return normalized(answer) == normalized(truth)


def as_number(text: str) -> float | None:
    """The number `text` states, ignoring $, % and thousands separators; None when it is no number."""
    cleaned = re.sub(r"[$%,\s]", "", text)
    try:
        return float(cleaned)
    except ValueError:
        return None


def normalized(text: str, *, keep_punctuation: bool = False) -> str:
    text = re.sub(r"\s", "", text).lower()
    return text if keep_punctuation else text.translate(str.maketrans("", "", string.punctuation))


def _numbers_match(answer: str, truth: str) -> bool:
    value = as_number(answer)
    return value is not None and value == as_number(truth)


def _items(text: str) -> list[str]:
    return [item.strip() for item in LIST_SEPARATORS.split(text)]
