"""Which policy (LoRA adapter) samples an agent's calls, when a run has several (config/policies.py)."""

from __future__ import annotations

import structlog

from agenttune.components.engines.base import InferenceEngine
from agenttune.config.policies import BASE_ADAPTER, PoliciesConfig
from agenttune.gateway.channel import EpisodeChannel

log = structlog.get_logger("agenttune.gateway")

# The episode counter (and metric) of calls from agents `policies.agents` does not name.
UNKNOWN_AGENT = "unknown_agent"


class PolicyRouter:
    """Agent name -> the engine's adapter for it. Routes only when the run has policies and the engine
    holds their adapters; otherwise every call samples from the model as it is (None)."""

    def __init__(self, policies: PoliciesConfig, engine: InferenceEngine, *, by_model: bool = False):
        """`by_model`: a request whose `model` names a policy samples with that policy's adapter, whichever
        agent sent it (`agenttune serve`, where no trainer files samples under agents)."""
        self.policies = policies
        self.by_model = by_model
        served = set(engine.adapter_names)
        self.routing = policies.enabled and set(policies.adapters) <= served
        self._reported: set[str] = set()
        if policies.enabled and not self.routing:
            # e.g. the debug backbone's engine, which loads the base model alone
            log.warning(f"policies: the {engine.name!r} engine does not serve the policies' adapters "
                        f"({sorted(policies.adapters)}); every agent samples from the model it has")

    def adapter_for(self, channel: EpisodeChannel, agent: str, model: str | None = None) -> str | None:
        if not self.routing:
            return None
        if self.by_model and model in self.policies.adapters:
            return model
        if not self.policies.knows(agent):
            channel.counters[UNKNOWN_AGENT] += 1
            self._report(agent)
        return self.policies.policy_of(agent) or BASE_ADAPTER

    def served_models(self) -> list[str]:
        """The model names a request may ask for besides the base model's: the policies, when routed by them."""
        return list(self.policies.adapters) if self.routing and self.by_model else []

    def _report(self, agent: str) -> None:
        """Once per name per gateway: an agent seen every call would flood the log."""
        if agent in self._reported:
            return
        self._reported.add(agent)
        fallback = self.policies.default_policy
        where = f"policy {fallback!r} (policies.default_policy)" if fallback else "the base model, untrained"
        log.warning(f"policies: agent {agent!r} is not in policies.agents; its calls use {where} "
                    f"(counted as {UNKNOWN_AGENT})")
