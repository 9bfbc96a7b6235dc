"""The GAIA-style AWorld agent: a system prompt asking for <answer>...</answer> and MCP tools.

The tools come from an MCP server. By default it is `gaia_tools_server.py` next to this file, which
AWorld starts over stdio; set GAIA_MCP_URL to use a server over streamable HTTP instead, such as
AWorld's GAIA environment (`http://localhost:8080/mcp`, see README.md), with GAIA_MCP_HEADERS as
JSON for its headers (e.g. '{"MCP_SERVERS": "readweb-server,googlesearch-server"}').

`build_agent()` makes a new agent; agenttune calls it once per episode (`aworld.agent` in the
config) and points the agent's LLM at the model under training, so the LLM settings here are only
what the agent would use on its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

SERVER = Path(__file__).resolve().parent / "gaia_tools_server.py"
SERVER_NAME = "gaia-tools"

SYSTEM_PROMPT = """You are a careful research assistant. Use the tools to look facts up and to compute.
When you know the answer, reply with it inside <answer></answer>, e.g. <answer>42</answer>:
a number without units, or as few words as possible."""


def mcp_config() -> dict[str, Any]:
    url = os.environ.get("GAIA_MCP_URL")
    if url:
        server = {"type": "streamable-http", "url": url, "timeout": 600, "sse_read_timeout": 600,
                  "headers": json.loads(os.environ.get("GAIA_MCP_HEADERS", "{}"))}
    else:
        server = {"command": sys.executable, "args": [str(SERVER)]}
    return {"mcpServers": {SERVER_NAME: server}}


def build_agent() -> Any:
    from aworld.agents.llm_agent import Agent
    from aworld.config import AgentConfig

    conf = AgentConfig(llm_provider="openai", llm_model_name=os.environ.get("LLM_MODEL_NAME", "gpt-4o"),
                       llm_base_url=os.environ.get("LLM_BASE_URL"), llm_api_key=os.environ.get("LLM_API_KEY", "unset"),
                       max_steps=6)
    return Agent(name="gaia_agent", desc="Answers GAIA-style questions with tools", conf=conf,
                 system_prompt=SYSTEM_PROMPT, mcp_config=mcp_config(), mcp_servers=[SERVER_NAME])
