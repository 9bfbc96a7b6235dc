"""The built-in tool-call and reasoning parsers, on their own."""

from __future__ import annotations

import json

import pytest

from agenttune.components.parsers.base import ToolParse
from agenttune.components.parsers.hermes import HermesToolParser
from agenttune.components.parsers.think import ThinkParser


def arguments(parse: ToolParse) -> list[tuple[str, dict]]:
    return [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in parse.calls]


def test_hermes_reads_parallel_calls_and_keeps_the_text_before_them():
    parse = HermesToolParser().parse('Checking.\n<tool_call>\n{"name": "a", "arguments": {"x": [1, 2]}}\n</tool_call>\n'
                                     '<tool_call>{"name": "b", "arguments": "{\\"y\\": \\"é\\"}"}</tool_call>')
    assert parse.content == "Checking." and not parse.errors
    assert arguments(parse) == [("a", {"x": [1, 2]}), ("b", {"y": "é"})]
    assert len({call["id"] for call in parse.calls}) == 2
    assert parse.calls[1]["function"]["arguments"] == '{"y": "é"}'


def test_hermes_accepts_an_unclosed_final_call_and_parameters_key():
    parse = HermesToolParser().parse('<tool_call>\n{"name": "a", "parameters": {"q": 1}}\n')
    assert arguments(parse) == [("a", {"q": 1})] and parse.content == ""


@pytest.mark.parametrize("text, problem", [
    ('<tool_call>{"name": "a", "arguments": {x}}</tool_call>', "not valid JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
    ('<tool_call>["a"]</tool_call>', "no 'name'"),
    ('<tool_call>{"name": "a", "arguments": "not json"}</tool_call>', "arguments are not JSON"),
    ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "must be an object"),
])
def test_hermes_reports_unreadable_calls_and_returns_the_text(text, problem):
    parse = HermesToolParser().parse("Hi " + text)
    assert parse.calls == [] and parse.content == "Hi " + text
    assert len(parse.errors) == 1 and problem in parse.errors[0]


def test_plain_text_has_no_calls():
    assert HermesToolParser().parse("Just text.") == ToolParse("Just text.")


@pytest.mark.parametrize("text, reasoning, content", [
    ("<think>\nplan\n</think>\n\nanswer", "plan", "answer"),
    ("plan only closes</think>answer", "plan only closes", "answer"),  # template opened <think> in the prompt
    ("no reasoning", None, "no reasoning"),
    ("<think>unfinished", None, "<think>unfinished"),
    ("text <think>x</think> more", None, "text <think>x</think> more"),
])
def test_think_parser(text, reasoning, content):
    assert ThinkParser().split(text) == (reasoning, content)
