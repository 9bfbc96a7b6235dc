"""The `policies:` section: several policies in one run, each a LoRA adapter on the run's base model.

An agent of a multi-agent workflow (the gateway key's `agent`, an AgentScope or AWorld agent's name) is
mapped to one policy; its calls are sampled with that policy's adapter and its samples train that
adapter only. Empty `adapters` (the default): one policy, exactly as without this section.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from agenttune.config.base import Section
from agenttune.errors import UserError

# The engine's name for "no adapter" in a batch of several (peft's own spelling for its per-row selection).
BASE_ADAPTER = "__base__"


class PolicyOptions(Section):
    """One policy: a LoRA adapter on `model.path`, its own learning rate, or frozen."""

    rank: int = Field(default=8, gt=0, description="LoRA rank of this policy's adapter.")
    alpha: int = Field(default=16, gt=0, description="LoRA alpha.")
    target_modules: list[str] | str = Field(default="all-linear", description="Modules the adapter adapts.")
    learning_rate: float | None = Field(default=None, gt=0,
                                        description="This policy's learning rate; none: trainer.learning_rate.")
    frozen: bool = Field(default=False, description="Sampled, never trained (a fixed opponent or critic). Its "
                                                    "adapter starts as LoRA does (B = 0: the base model) unless "
                                                    "`init` names trained adapter weights.")
    init: str | None = Field(default=None, description="Directory of saved peft adapter weights to start from "
                                                       "(a checkpoint's model/<policy>/); none: a fresh adapter.")


class PoliciesConfig(Section):
    """Several policies in one run (docs/multi_policy.md); leave `adapters` empty for one."""

    adapters: dict[str, PolicyOptions] = Field(
        default_factory=dict, description="Policy name -> its LoRA adapter; empty: one policy (the model, or "
                                          "local.lora_rank's adapter), as without this section.")
    agents: dict[str, str] = Field(
        default_factory=dict, description="Agent name (the gateway key's `agent`; `default` for calls without one) "
                                          "-> policy name.")
    reward: Literal["team", "per_agent"] = Field(
        default="team", description="What each policy trains on: `team`, the episode's reward for every policy; "
                                    "`per_agent`, each of its agents' samples on that agent's own reward, in "
                                    "advantage groups of that agent's (the judge's `JudgeResult.agent_rewards`; "
                                    "the team's where the judge gave none).")
    default_policy: str | None = Field(
        default=None, description="The policy of agents `agents` does not name; none: such agents sample from the "
                                  "base model (no adapter) and are never trained. Either way they are counted "
                                  "(unknown_agent) and logged.")

    @property
    def enabled(self) -> bool:
        return bool(self.adapters)

    def policy_of(self, agent: str) -> str | None:
        """The policy an agent's calls sample from and its samples train; None: the base model, untrained."""
        return self.agents.get(agent, self.default_policy)

    def knows(self, agent: str) -> bool:
        return agent in self.agents

    def trained(self) -> list[str]:
        """The policies that train, in the config's order."""
        return [name for name, policy in self.adapters.items() if not policy.frozen]


def check_policies(policies: PoliciesConfig, lora_rank: int = 0) -> None:
    """The map must name defined policies, and every policy must be used: one paragraph otherwise."""
    if not policies.adapters:
        if policies.agents or policies.default_policy:
            raise UserError("policies.agents / policies.default_policy are set but policies.adapters defines no "
                            "policy, so there is nothing to map agents to.",
                            hint="Define the policies under policies.adapters (e.g. {writer: {rank: 8}}), or "
                                 "remove policies.agents and policies.default_policy.")
        if policies.reward != "team":
            raise UserError(f"policies.reward is {policies.reward!r} but policies.adapters defines no policy: with "
                            "one policy every agent's samples train on the episode's reward.",
                            hint="Define the policies under policies.adapters, or remove policies.reward.")
        return
    names = set(policies.adapters)
    if BASE_ADAPTER in names:
        raise UserError(f"policies.adapters may not define a policy named {BASE_ADAPTER!r}: the engine uses that "
                        "name for the base model.", hint="Rename the policy.")
    unknown = {agent: policy for agent, policy in policies.agents.items() if policy not in names}
    if policies.default_policy is not None and policies.default_policy not in names:
        unknown["(policies.default_policy)"] = policies.default_policy
    if unknown:
        listed = ", ".join(f"{agent} -> {policy}" for agent, policy in unknown.items())
        raise UserError(f"policies.agents maps agents to policies that policies.adapters does not define ({listed}); "
                        f"the defined policies are {sorted(names)}.",
                        hint="Fix the policy names in policies.agents, or define those policies under "
                             "policies.adapters.")
    used = set(policies.agents.values()) | {policies.default_policy}
    unused = sorted(names - used)
    if unused:
        raise UserError(f"policies.adapters defines {unused}, which no agent uses (policies.agents and "
                        "policies.default_policy name none of them): such a policy would never be sampled or "
                        "trained.", hint="Map an agent to it in policies.agents, or remove it.")
    if lora_rank > 0:
        raise UserError(f"local.lora_rank ({lora_rank}) and policies.adapters are both set: with several policies "
                        "each adapter's rank is its own (policies.adapters.<name>.rank).",
                        hint="Remove local.lora_rank (set it to 0) and give each policy its rank.")


def policy_summary(policies: PoliciesConfig) -> dict[str, Any]:
    """For the log: which agents each policy serves."""
    return {name: sorted(agent for agent, policy in policies.agents.items() if policy == name)
            + (["(unmapped agents)"] if policies.default_policy == name else [])
            for name in policies.adapters}
