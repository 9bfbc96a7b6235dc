"""Registers the `aworld` agent framework with agenttune."""
