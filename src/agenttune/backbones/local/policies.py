"""Several policies in one run: one LoRA adapter per policy on one base model, each trained on the
samples of its own agents only, with its own optimizer, schedule and advantage groups (config/policies.py).

One peft model holds every adapter. The `hf` engine samples each agent's calls with its policy's
adapter (rows of different adapters in one batch: components/engines/adapter_rows.py); the update
trains one policy at a time with only its adapter active, so only its weights carry gradients and
only they are in its optimizer: another policy's samples never move them, and a frozen policy's
adapter is in no optimizer at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agenttune.config.models import AgentTuneConfig
from agenttune.config.policies import PoliciesConfig, PolicyOptions, check_policies
from agenttune.config.run import get_logger
from agenttune.errors import UserError
from agenttune.workflow.episode import Episode, EpisodeStatus, Sample

if TYPE_CHECKING:
    from peft import PeftModel

log = get_logger("local")


# -- the model ----------------------------------------------------------------------------------------
def with_adapters(model: torch.nn.Module, config: AgentTuneConfig, *, checkpoint: Path | None = None,
                  lora_rank: int = 0) -> PeftModel:
    """The base model with one adapter per policy: fresh, from a policy's `init`, or from a checkpoint's
    `model/` directory (peft saves each adapter in `model/<name>/`)."""
    from peft import LoraConfig, get_peft_model

    policies = config.policies
    check_policies(policies, lora_rank)
    peft_model: PeftModel | None = None
    for name, policy in policies.adapters.items():
        lora = LoraConfig(r=policy.rank, lora_alpha=policy.alpha, target_modules=policy.target_modules,
                          lora_dropout=0.0, task_type="CAUSAL_LM")
        _check_fits(model if peft_model is None else peft_model, name, policy)
        try:
            if peft_model is None:
                peft_model = get_peft_model(model, lora, adapter_name=name)
            else:
                peft_model.add_adapter(name, lora)
        except ValueError as error:  # peft: target modules not found in the model
            raise _misfit(name, policy, str(error)) from error
        _check_linear_only(peft_model, name, policy)
        saved = _adapter_dir(checkpoint, name) if checkpoint is not None else policy.init
        if saved is not None:
            _load_adapter_weights(peft_model, name, Path(saved))
    assert peft_model is not None  # check_policies: policies.enabled
    for name, policy in policies.adapters.items():
        if policy.frozen:
            _adapter_parameters(peft_model, name, trainable=False)
    log.info("policies", **{name: f"rank {policy.rank}" + (" frozen" if policy.frozen else "")
                             for name, policy in policies.adapters.items()})
    return peft_model


def _adapter_dir(model_dir: Path, name: str) -> Path:
    """Where peft's `save_pretrained` put adapter `name` (peft writes `default` at the top)."""
    return model_dir if name == "default" else model_dir / name


def _check_fits(model: torch.nn.Module, name: str, policy: PolicyOptions) -> None:
    """A rank above the smallest dimension it adapts adds parameters that cannot add rank."""
    smallest = min((min(module.in_features, module.out_features) for module in model.modules()
                    if isinstance(module, torch.nn.Linear)), default=None)
    if smallest is not None and policy.rank > smallest:
        raise _misfit(name, policy, f"rank {policy.rank} is more than the smallest dimension of the model's linear "
                                    f"layers ({smallest})")


def _check_linear_only(model: torch.nn.Module, name: str, policy: PolicyOptions) -> None:
    """The engine runs each row's adapter in LoRA's linear layers only (components/engines/adapter_rows.py):
    an adapted embedding would run one adapter for every row of a batch."""
    from peft.tuners.lora import Linear, LoraLayer

    other = sorted({type(module).__name__ for module in model.modules()
                    if isinstance(module, LoraLayer) and not isinstance(module, Linear)})
    if other:
        raise _misfit(name, policy, f"with several policies only linear layers can be adapted, and the target "
                                    f"modules include {', '.join(other)} layers")


def _misfit(name: str, policy: PolicyOptions, why: str) -> UserError:
    return UserError(f"policies.adapters.{name} does not fit model.path: {why}.",
                     hint=f"Check policies.adapters.{name}.rank and .target_modules ({policy.target_modules!r}) "
                          "against the model's layers, or its init directory.")


def _load_adapter_weights(model: PeftModel, name: str, directory: Path) -> None:
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    try:
        weights = load_peft_weights(str(directory))
        result = set_peft_model_state_dict(model, weights, adapter_name=name)
    except (OSError, ValueError, RuntimeError) as error:  # missing files, shapes of another rank or model
        raise UserError(f"Cannot load policy {name!r}'s adapter weights from {str(directory)!r}: {error}",
                        hint="Point policies.adapters.<name>.init at a peft adapter directory saved for this "
                             "model with this rank and target modules.") from error
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise UserError(f"Policy {name!r}'s adapter weights in {str(directory)!r} do not fit its adapter "
                        f"({len(unexpected)} unexpected tensors, e.g. {unexpected[0]}).",
                        hint="Use weights saved with the same rank, target modules and base model.")


def _adapter_parameters(model: torch.nn.Module, name: str, *, trainable: bool) -> list[torch.nn.Parameter]:
    found = [parameter for key, parameter in model.named_parameters() if f".{name}." in key and "lora_" in key]
    for parameter in found:
        parameter.requires_grad_(trainable)
    return found


# -- training -----------------------------------------------------------------------------------------
class PolicyTrainers:
    """One GRPOTrainer per trained policy over the shared peft model; the loop drives it as one trainer.

    `make_trainer(config)` builds a trainer for the model's active adapter (its `trainable` are that
    adapter's weights) with `config`'s learning rate."""

    def __init__(self, model: Any, config: AgentTuneConfig, make_trainer: Any):  # a PeftModel (with_adapters)
        self.model = model
        self.policies: PoliciesConfig = config.policies
        self.trainers: dict[str, Any] = {}  # name -> GRPOTrainer (not imported: through policy.py that would close a cycle)
        for name in self.policies.trained():
            model.set_adapter(name)  # peft: only the active adapter's weights require gradients
            self.trainers[name] = make_trainer(_policy_config(config, self.policies.adapters[name]))
        first = next(iter(self.trainers.values()), None) or make_trainer(config)
        self.estimator, self.device, self.threads = first.estimator, first.device, first.threads

    def step(self, episodes: list[Episode], *, threads: int | None = None) -> dict[str, float]:
        """Each trained policy's update on its own agents' samples; metrics `policy/<name>/...`, and
        the totals the loop's throughput figures read."""
        metrics: dict[str, float] = {"policies/untrained_samples": float(self._unmapped(episodes))}
        if self.policies.reward == "per_agent":  # such episodes train every policy on the team's reward
            metrics["policies/episodes_without_agent_rewards"] = float(
                sum(1 for episode in episodes if not episode.agent_rewards and not episode.status.failed))
        for name, trainer in self.trainers.items():
            self.model.set_adapter(name)
            own = samples_of(episodes, self.policies, name)
            step = trainer.step(own, threads=threads)
            metrics.update({f"policy/{name}/{key}": value for key, value in step.items()})
            rewards = [episode.reward for episode in own if not episode.status.failed]
            if rewards:  # the reward this policy trained on (the team's, or its agents' with per_agent)
                metrics[f"policy/{name}/reward/mean"] = sum(rewards) / len(rewards)
            for total in ("train/tokens", "train/samples", "perf/train_time_s"):
                metrics[total] = metrics.get(total, 0.0) + step.get(total, 0.0)
        return metrics

    def _unmapped(self, episodes: list[Episode]) -> int:
        return sum(1 for episode in episodes for sample in episode.samples
                   if sample.trainable and self.policies.policy_of(sample.agent) is None)

    def state_dict(self) -> dict:
        return {"policies": {name: trainer.state_dict() for name, trainer in self.trainers.items()}}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("policies")
        if saved is None or set(saved) != set(self.trainers):
            raise UserError(f"--resume: the checkpoint's trained policies ({sorted(saved or [])}) are not this "
                            f"config's ({sorted(self.trainers)}).",
                            hint="Resume with the policies the run started with, or start a new run.")
        for name, trainer in self.trainers.items():
            trainer.load_state_dict(saved[name])

    def close(self) -> None:
        for trainer in self.trainers.values():
            trainer.close()


def _policy_config(config: AgentTuneConfig, policy: PolicyOptions) -> AgentTuneConfig:
    """The run's config with this policy's learning rate (the trainer reads it from trainer.learning_rate)."""
    if policy.learning_rate is None:
        return config
    copied = config.model_copy(deep=True)
    copied.trainer.learning_rate = policy.learning_rate
    return copied


def samples_of(episodes: list[Episode], policies: PoliciesConfig, name: str) -> list[Episode]:
    """The episodes with only the samples of policy `name`'s agents. Every episode stays, so each
    advantage group holds every episode of its task (verl's per-policy normalisation: each policy's own
    rows). Their reward is the team's, or with `policies.reward: per_agent` the policy's own agent's:
    where several agents with rewards of their own share the policy, each is a row of its own, in a group
    of its own (its task's episodes, that agent's samples and reward), so no agent's samples are credited
    with another's reward, nor measured against another's baseline."""
    kept: list[Episode] = []
    for episode in episodes:
        agents = _rewarded_agents(episode, policies, name)
        if len(agents) < 2:
            keep = [policies.policy_of(sample.agent) == name for sample in episode.samples]
            kept.append(_keep_samples(episode, keep, policy_reward(episode, policies, name)))
            continue
        for agent in agents:
            own = _keep_samples(episode, [sample.agent == agent for sample in episode.samples],
                                episode.agent_rewards[agent])  # type: ignore[index]  # _rewarded_agents: present
            kept.append(own.model_copy(update={"episode_id": f"{episode.episode_id}/{agent}",
                                               "group_id": f"{episode.group_id}/{agent}"}))
        unrated = [sample.agent not in agents and policies.policy_of(sample.agent) == name
                   for sample in episode.samples]
        if any(unrated):  # the policy's agents the judge did not rate: the team's reward, as without per_agent
            kept.append(_keep_samples(episode, unrated, episode.reward))
    return kept


def _rewarded_agents(episode: Episode, policies: PoliciesConfig, name: str) -> list[str]:
    """The agents of policy `name` the judge rated in this episode, when their rewards train (per_agent)."""
    if (policies.reward != "per_agent" or not episode.agent_rewards or episode.status.failed
            or episode.status is EpisodeStatus.MADNESS):  # the penalty is every agent's: one row, as the team's
        return []
    return sorted(agent for agent in episode.agent_rewards if policies.policy_of(agent) == name)


def policy_reward(episode: Episode, policies: PoliciesConfig, name: str) -> float:
    """The reward policy `name` trains on: (per_agent) the judge's reward for its one rated agent
    (`samples_of` splits the episode where several are), else the team's: with `policies.reward: team`,
    where the judge rated none of its agents, or where a madness check replaced the judge's reward with its
    penalty (which every policy of the episode gets)."""
    agents = _rewarded_agents(episode, policies, name)
    return episode.agent_rewards[agents[0]] if len(agents) == 1 else episode.reward  # type: ignore[index]


def _keep_samples(episode: Episode, keep: list[bool], reward: float) -> Episode:
    samples = [sample for sample, kept in zip(episode.samples, keep, strict=True) if kept]
    update: dict[str, Any] = {"samples": samples, "reward": reward}
    if episode.turn_rewards is not None:  # per call, samples in order: keep the kept samples' calls
        update["turn_rewards"] = _kept_calls(episode.samples, keep, episode.turn_rewards)
    return episode.model_copy(update=update)


def _kept_calls(samples: list[Sample], keep: list[bool], rewards: list[float]) -> list[float]:
    kept, start = [], 0
    for sample, wanted in zip(samples, keep, strict=True):
        end = start + sample.num_calls
        if wanted:
            kept.extend(rewards[start:end])
        start = end
    return kept
