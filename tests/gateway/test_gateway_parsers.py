"""Tool-call and reasoning parsers, and the madness detectors, on their own."""

from __future__ import annotations

import json

import pytest

from agenttune.errors import UserError
from agenttune.gateway import madness
from agenttune.gateway.reasoning import ThinkParser, get_reasoning_parser
from agenttune.gateway.tool_parsers import HermesToolParser, ToolParse, ToolParser, get_tool_parser


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


def test_tool_parser_registry():
    assert isinstance(get_tool_parser("hermes"), HermesToolParser)
    assert isinstance(get_tool_parser("agenttune.gateway.tool_parsers:HermesToolParser"), ToolParser)
    with pytest.raises(UserError, match="unknown tool parser 'nope'. Available: hermes"):
        get_tool_parser("nope")


@pytest.mark.parametrize("text, reasoning, content", [
    ("<think>\nplan\n</think>\n\nanswer", "plan", "answer"),
    ("plan only closes</think>answer", "plan only closes", "answer"),  # template opened <think> in the prompt
    ("no reasoning", None, "no reasoning"),
    ("<think>unfinished", None, "<think>unfinished"),
    ("text <think>x</think> more", None, "text <think>x</think> more"),
])
def test_think_parser(text, reasoning, content):
    assert ThinkParser().split(text) == (reasoning, content)


def test_reasoning_parser_registry():
    assert get_reasoning_parser(None) is None
    with pytest.raises(UserError, match="unknown reasoning parser"):
        get_reasoning_parser("deepseek")


def test_repetition_loop_detection():
    assert madness.repetition_loop([7] * 60)
    assert madness.repetition_loop(list(range(10)) + [1, 2, 3, 4] * 15)
    assert not madness.repetition_loop([1, 2, 3] * 10)  # too short to call it a loop
    assert not madness.repetition_loop(list(range(200)))
    assert not madness.repetition_loop(list(range(40)) * 2)  # period 40 > MAX_PERIOD: a repeated paragraph


def test_wrong_tool_calls():
    call = {"function": {"name": "rm"}}
    assert madness.wrong_tool_calls([call], [], {"ls"}, False) == ["unknown tool 'rm'"]
    assert madness.wrong_tool_calls([call], [], {"rm"}, False) == []
    assert madness.wrong_tool_calls([], ["bad json"], {"rm"}, True) == [
        "bad json", "tool-call markup but the request offered no tools"]
