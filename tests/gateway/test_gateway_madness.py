"""The madness detectors, on their own."""

from __future__ import annotations

from agenttune.gateway import madness


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
