"""Which parsers `gateway.tool_parser` and `gateway.reasoning_parser` select."""

from __future__ import annotations

import pytest

from agenttune.components.parsers.base import ReasoningParser, ToolParser
from agenttune.components.parsers.hermes import HermesToolParser
from agenttune.components.parsers.think import ThinkParser
from agenttune.errors import UserError
from agenttune.gateway.parser_choice import reasoning_parser, tool_parser
from agenttune.testing.gateways import tiny_config


def test_tool_parser_by_name_or_reference():
    assert isinstance(tool_parser(tiny_config()), HermesToolParser)  # the default
    reference = tiny_config(gateway={"tool_parser": "agenttune.components.parsers.hermes:HermesToolParser"})
    assert isinstance(tool_parser(reference), ToolParser)
    with pytest.raises(UserError, match="unknown tool parser 'nope'. Available: hermes") as raised:
        tool_parser(tiny_config(gateway={"tool_parser": "nope"}))
    assert "my_module:MyParser" in str(raised.value)


def test_reasoning_parser_by_name_reference_or_none():
    assert isinstance(reasoning_parser(tiny_config()), ThinkParser)  # the default
    assert reasoning_parser(tiny_config(gateway={"reasoning_parser": None})) is None
    reference = tiny_config(gateway={"reasoning_parser": "agenttune.components.parsers.think:ThinkParser"})
    assert isinstance(reasoning_parser(reference), ThinkParser)
    with pytest.raises(UserError, match="unknown reasoning parser 'deepseek'. Available: think"):
        reasoning_parser(tiny_config(gateway={"reasoning_parser": "deepseek"}))


class UnmarkedParser(ReasoningParser):
    """A reasoning parser that forgot its markers."""

    def split(self, text: str) -> tuple[str | None, str]:
        return None, text


def test_a_reasoning_parser_without_markers_is_refused():
    config = tiny_config(gateway={"reasoning_parser": f"{__name__}:UnmarkedParser"})
    with pytest.raises(UserError, match="does not set its markers OPEN and CLOSE"):
        reasoning_parser(config)
