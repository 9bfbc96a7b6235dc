"""The parsers a config's `gateway.tool_parser` and `gateway.reasoning_parser` name.

A name is a registered parser (a built-in, or a plugin's through `register_tool_parsers` /
`register_reasoning_parsers`) or a `module:Class` reference, which needs no plugin.
"""

from __future__ import annotations

from typing import Literal, overload

from agenttune.components.parsers.base import ReasoningParser, ToolParser
from agenttune.config.models import AgentTuneConfig
from agenttune.config.references import load_reference
from agenttune.errors import PluginError, UserError
from agenttune.registry.manager import get_component, get_plugin_manager


def tool_parser(config: AgentTuneConfig) -> ToolParser:
    return _parser("tool_parsers", config.gateway.tool_parser, config, key="gateway.tool_parser")


def reasoning_parser(config: AgentTuneConfig) -> ReasoningParser | None:
    name = config.gateway.reasoning_parser
    if name is None:  # null: the reasoning stays in the content
        return None
    parser = _parser("reasoning_parsers", name, config, key="gateway.reasoning_parser")
    if not (parser.OPEN and parser.CLOSE):  # an empty marker is found everywhere: every reply would be reasoning
        raise UserError(f"gateway.reasoning_parser: {name!r} ({type(parser).__name__}) does not set its markers "
                        "OPEN and CLOSE.",
                        hint="Give the parser class the strings that open and close the reasoning, e.g. "
                             "OPEN, CLOSE = '<think>', '</think>'.")
    return parser


@overload
def _parser(kind: Literal["tool_parsers"], name: str, config: AgentTuneConfig, *, key: str) -> ToolParser: ...
@overload
def _parser(kind: Literal["reasoning_parsers"], name: str, config: AgentTuneConfig, *,
            key: str) -> ReasoningParser: ...
def _parser(kind: Literal["tool_parsers", "reasoning_parsers"], name: str, config: AgentTuneConfig, *,
            key: str) -> ToolParser | ReasoningParser:
    if name not in get_plugin_manager().names(kind) and (":" in name or "->" in name):
        return load_reference(name, key=key, search_path=config.source_dir)()
    try:
        parser_cls = get_component(kind, name, key=key)
    except PluginError as error:  # unknown: two plugins clashing would have failed names() above
        contract = "ToolParser" if kind == "tool_parsers" else "ReasoningParser"
        raise UserError(error.message, hint=f"Use one of those, or 'my_module:MyParser' (a subclass of "
                                            f"agenttune.plugin_api.{contract}).") from error
    return parser_cls()
