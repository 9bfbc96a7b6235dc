"""Parsers that read a model's reply text: tool calls (`gateway.tool_parser`) and reasoning
(`gateway.reasoning_parser`). The contracts are in `base.py`; plugins add more through the
`register_tool_parsers` and `register_reasoning_parsers` hooks."""
