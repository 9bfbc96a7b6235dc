"""The `policies:` section (docs/multi_policy.md) on verl: one policy becomes verl's LoRA, more are refused.

verl trains one model per run, and with `actor_rollout_ref.model.lora_rank` it trains a LoRA adapter on
it (peft, in its FSDP workers). So a `policies:` section with a single trained adapter that every agent
samples from is verl's LoRA, with the adapter's rank, alpha, target modules, initial weights and learning
rate. verl merges the adapter into the base weights before each weight sync (`model.lora.merge: true`):
the rollout (vLLM, or agenttune's `hf` engine on CPU) serves plain weights, so no adapter has to be loaded
on the serving side. Anything that needs more than one set of adapter weights, or agents that sample
from different weights, is refused.
"""

from __future__ import annotations

from typing import Any

from agenttune.plugin_api import AgentTuneConfig, UserError

HINT_LOCAL = "Train several policies with --backbone local, or remove the policies: section to train one policy here."


def one_policy(config: AgentTuneConfig) -> tuple[str, Any] | None:
    """(name, PolicyOptions) of the single adapter verl trains; None without `policies.adapters`."""
    adapters = config.policies.adapters
    if len(adapters) != 1:
        return None
    return next(iter(adapters.items()))


def policy_problems(config: AgentTuneConfig) -> list[UserError]:
    policies = config.policies
    if len(policies.adapters) > 1:
        return [UserError(
            f"policies.adapters defines {len(policies.adapters)} policies ({', '.join(policies.adapters)}), but "
            "verl trains one policy per run: it cannot sample each agent with its own adapter nor keep an "
            "optimizer per adapter.", hint=HINT_LOCAL)]
    single = one_policy(config)
    if single is None:
        return []
    name, policy = single
    problems = []
    if policy.frozen:
        problems.append(UserError(
            f"policies.adapters.{name} is frozen and is the only policy: a verl run would train nothing.",
            hint=f"Remove frozen: true from policies.adapters.{name}, or serve the adapter without training it."))
    if policies.default_policy != name:
        problems.append(UserError(
            f"policies.default_policy is {policies.default_policy!r}, not {name!r}: with verl every agent samples "
            f"from the one model it trains (here policy {name!r}'s adapter, merged), so agents the map does not "
            "name cannot sample from the base model as the local backbone would make them.",
            hint=f"Set policies.default_policy: {name} (every agent on the one policy), or train with --backbone "
                 "local."))
    if policies.reward == "per_agent":
        problems.append(UserError(
            "policies.reward is 'per_agent', but verl trains every sample of an episode on the episode's one "
            "reward.", hint="Remove policies.reward (the team's reward), or train with --backbone local."))
    return problems
