"""The `agentscope:` config section: how models handed to AgentScope agents behave."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class AgentScopeOptions(BaseModel):
    """Settings for `tuner.as_agentscope_model()`; keyword arguments to that call win over them.

    The headless defaults exist because RL rollouts have no human at the keyboard and must see the
    same prompt every time: AgentScope 2.x asks a user before running a custom tool and writes the
    wall-clock time into prompts, both of which are right for an interactive assistant and wrong
    for training.
    """

    model_config = ConfigDict(extra="forbid")

    stream: bool | None = Field(
        default=None, description="Stream chat completions; none keeps AgentScope's default (streaming)."
    )
    headless: bool = Field(
        default=True,
        description="Give AgentScope 2.x agents built on a tuner model the headless defaults below "
        "(only where the workflow passed no state / injection_config of its own).",
    )
    permission_mode: Literal["bypass", "dont_ask", "default", "accept_edits", "explore"] = Field(
        default="bypass",
        description="AgentScope 2.x tool permission mode for headless agents. 'default' asks a human "
        "before every custom tool call, which parks a rollout forever.",
    )
    inject_runtime_state: bool = Field(
        default=False,
        description="Let AgentScope 2.x inject the runtime state (current time, context usage) into "
        "prompts. Off for RL: it makes prompts differ between otherwise identical episodes.",
    )
    context_size: int | None = Field(
        default=None, gt=0, description="AgentScope 2.x model context size (its memory compresses at trigger_ratio "
                                        "x this); none: model.max_model_len - rollout.max_response_length_in_one_turn "
                                        "- 64, so it compresses before the gateway refuses a call."
    )
