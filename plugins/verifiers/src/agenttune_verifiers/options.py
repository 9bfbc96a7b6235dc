"""Which verifiers environment a run trains on: the `task_reader:` keys of `type: verifiers`.

    task_reader:
      type: verifiers
      id: my-env                 # the environment (taskset) package, as `prime env install` / pip installed it
      args: {difficulty: 2}      # its taskset's config fields (what `--env.taskset.*` sets in `vf-eval`)
      split_args: {test: {split: test}}   # per agenttune split, merged over args
      validation_split: test

Every task carries the resolved environment config in its metadata, so the workflow and the judge
(possibly in another process) rebuild the same environment from the task alone.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The harness verifiers runs for a taskset that ships none: verifiers' own chat loop (the `null`
# harness's program, tools through MCP), run by this Python instead of a uv-synced one, so it needs no
# network (agenttune_chat).
CHAT_HARNESS = "agenttune-chat"
METADATA_KEY = "verifiers"


class VerifiersOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The environment's taskset id: an installed package exporting a verifiers Taskset "
                                "(a hub id `owner/name@version` is accepted; it imports as `name`).")
    args: dict[str, Any] = Field(default_factory=dict, description="The taskset's config fields.")
    split_args: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per agenttune split (train, test, ...): taskset fields merged over args.")
    limit: int | None = Field(default=None, gt=0, description="Most tasks read per split (an endless taskset needs it).")
    env_id: str = Field(default="", description="A verifiers Env to pair with the taskset (`--env.id`); empty: the "
                                                "taskset's own, else the single-agent env.")
    harness: str | None = Field(
        default=None, description=f"Harness id for the agent seat. None: the taskset's bundled harness, else "
                                  f"{CHAT_HARNESS!r} (verifiers' chat loop run by this Python; 'null' and 'bash' run "
                                  "verifiers' own, installed with uv).")
    max_turns: int | None = Field(default=None, gt=0, description="The agent's most model calls per episode.")
    rollout_timeout: float | None = Field(default=None, gt=0,
                                          description="verifiers' own limit on one agent run, in seconds.")
    agent: dict[str, Any] = Field(default_factory=dict,
                                  description="Further AgentConfig fields of the `agent` seat (merged last).")
    env: dict[str, Any] = Field(default_factory=dict,
                                description="Further EnvConfig fields (timeouts, retries, ...), merged last.")

    def env_config(self, split: str) -> dict[str, Any]:
        """The verifiers EnvConfig (as plain data) for one split; the model and client are filled per episode."""
        agent: dict[str, Any] = {"runtime": {"type": "subprocess"}}  # the box is this machine (verifiers: prime)
        if self.harness is not None:
            agent["harness"] = {"id": self.harness}
        if self.max_turns is not None:
            agent["max_turns"] = self.max_turns
        if self.rollout_timeout is not None:
            agent["timeout"] = {"rollout": self.rollout_timeout}
        agent.update(self.agent)
        config: dict[str, Any] = {
            "taskset": {"id": self.id, **self.args, **self.split_args.get(split, {})},
            "agent": agent,
        }
        if self.env_id:
            config["id"] = self.env_id
        config.update(self.env)
        return config
