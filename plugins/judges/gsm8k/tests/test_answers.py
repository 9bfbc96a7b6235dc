"""Strict answer extraction and number comparison (the fallback and the format metric)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from agenttune_gsm8k.answers import (
    answer_text,
    boxed_contents,
    ground_truth,
    number_value,
    same_answer,
    strict_answer,
)


def test_boxed_contents_balance_braces_and_keep_order() -> None:
    text = r"First \boxed{\frac{1}{2}}, then \fbox{3}, finally \boxed{ 1,234 }."
    assert boxed_contents(text) == [r"\frac{1}{2}", "3", "1,234"]
    assert boxed_contents(r"\boxed{unclosed") == []


@pytest.mark.parametrize(("text", "expected"), [
    ("so the total is \\boxed{72}.", ("72", "boxed")),
    ("48 + 24 = 72\n#### 72", ("72", "hash")),
    ("#### 70\nwait, recount\n#### 72.", ("72", "hash")),  # the last marker counts
    ("\\boxed{70} ... no: \\boxed{72}\n#### 5", ("72", "boxed")),  # boxed wins over ####
    ("The answer is 72.", (None, None)),  # unmarked: strict finds nothing
])
def test_strict_answer(text: str, expected: tuple[str | None, str | None]) -> None:
    assert strict_answer(text) == expected


@pytest.mark.parametrize(("text", "value"), [
    ("1,234", Fraction(1234)),
    ("$1,234.50", Fraction(246900, 200)),
    ("\\$5", Fraction(5)),
    ("0.50", Fraction(1, 2)),
    ("72.", Fraction(72)),
    ("-3", Fraction(-3)),
    ("3/4", Fraction(3, 4)),
    ("\\frac{3}{4}", Fraction(3, 4)),
    ("\\text{18}", Fraction(18)),
    ("25\\%", Fraction(25)),
    ("1 000", Fraction(1000)),
    ("seventy-two", None),
    ("72 clips", None),
    ("x = 3", None),
])
def test_number_value(text: str, value: Fraction | None) -> None:
    assert number_value(text) == value


def test_same_answer_compares_numbers_exactly_and_text_otherwise() -> None:
    assert same_answer("1234", "$1,234.00")
    assert same_answer("0.5", "\\frac{1}{2}")
    assert not same_answer("72", "72.5")
    assert same_answer("x + 1", "x  +  1")
    assert not same_answer("72", "seventy-two")


def test_ground_truth_from_metadata() -> None:
    assert ground_truth({"ground_truth": "72"}) == "72"
    assert ground_truth({"answer": "48/2 = <<48/2=24>>24\n#### 1,000"}) == "1,000"
    assert ground_truth({"ground_truth": "", "answer": "#### 5"}) == "5"
    assert ground_truth({"solution": "#### 9"}, key="solution") == "9"
    assert ground_truth({"question": "?"}) is None


def test_answer_text_unwraps_handed_values() -> None:
    assert answer_text(72) == "72"
    assert answer_text({"result": "\\boxed{5}"}) == "\\boxed{5}"
    assert answer_text(None) == ""
