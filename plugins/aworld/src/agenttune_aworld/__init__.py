"""agenttune-plugin-aworld."""
