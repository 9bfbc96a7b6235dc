"""The `aworld:` config section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AWorldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str | None = Field(
        default=None,
        description="'module:NAME' of the AWorld agent that agenttune_aworld.AgentWorkflow trains: a function "
        "returning a new Agent (called once per episode), or an Agent, rebuilt per episode from its settings.",
    )
