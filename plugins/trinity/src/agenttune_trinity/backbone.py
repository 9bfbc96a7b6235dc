"""The `trinity` backbone: GRPO on a Ray GPU cluster through Trinity-RFT 0.6.0."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, ClassVar

from agenttune.plugin_api import Backbone, UserError, missing_validation_split
from agenttune_trinity.options import TrinityOptions, tinker_mode
from agenttune_trinity.translation import TrinityPaths, generated_config, trinity_config

if TYPE_CHECKING:
    from agenttune.plugin_api import AgentTuneConfig, Run


# engine.type values that say what Trinity does anyway: its own vLLM engines generate (hf: the default)
TRINITY_ENGINES = ("hf", "vllm")


class TrinityBackbone(Backbone):
    name: ClassVar[str] = "trinity"
    description: ClassVar[str] = "GRPO on a Ray GPU cluster through Trinity-RFT 0.6.0 (vLLM rollouts, verl training)."
    Options: ClassVar[type[TrinityOptions]] = TrinityOptions

    @classmethod
    def check(cls, config: AgentTuneConfig) -> None:
        """Config-level checks only: GPUs and vLLM are looked for when the run finds its Ray cluster."""
        require_trinity()
        problems = config_problems(config)
        if problems:
            raise problems[0]
        generated_config(config, TrinityPaths.placeholder(config))  # raises what the table cannot translate

    @classmethod
    def native_config(cls, config: AgentTuneConfig) -> dict[str, Any]:
        """Trinity's config for `config`; run-specific paths are shown as `<run_dir>/...`."""
        return trinity_config(config, TrinityPaths.placeholder(config))

    def run(self, run: Run) -> None:
        from agenttune.plugin_api import resolve
        from agenttune_trinity.launch import launch

        launch(run, run.components or resolve(run.config))  # what `agenttune train` resolved, else once here


TRINITY_VERSION = "0.6.0"  # what the translation, the workflow adapter and the Tinker-mode path are written for


def require_trinity() -> None:
    if importlib.util.find_spec("trinity") is None:
        raise UserError("The trinity backbone needs Trinity-RFT 0.6.0, which is not installed in this environment.",
                        hint="pip install 'agenttune-plugin-trinity[trinity]' (Trinity-RFT with vLLM, for GPU "
                             "machines). It conflicts with the verl plugin's verl version: use its own environment.")
    installed = installed_trinity_version()
    if installed != TRINITY_VERSION:
        raise UserError(
            f"The trinity backbone is written for Trinity-RFT {TRINITY_VERSION} (its config schema, its workflow "
            f"and Tinker-mode classes, checked by this plugin's tests), and this environment has {installed}, whose "
            "config keys and internals may differ: the run could fail deep inside Trinity or train differently "
            "from what the generated config says.",
            hint=f"pip install 'trinity-rft=={TRINITY_VERSION}' (CPU: with --no-deps, see the plugin's README).")


def installed_trinity_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trinity-rft")
    except PackageNotFoundError:
        return "an unknown version (no trinity-rft distribution is installed, only a `trinity` package)"


def config_problems(config: AgentTuneConfig) -> list[UserError]:
    problems = []
    if not config.model.path:
        problems.append(UserError("model.path is not set: Trinity-RFT needs the model to train.",
                                  hint="Set model.path to a Hugging Face model id or a local model directory."))
    if validation := missing_validation_split(config):
        problems.append(validation)
    if len(config.policies.adapters) > 1:  # several policies (docs/multi_policy.md): the local backbone only
        problems.append(UserError(
            f"policies.adapters defines {len(config.policies.adapters)} policies ({', '.join(config.policies.adapters)}), "
            "but Trinity-RFT trains one policy per run: it cannot sample each agent with its own adapter nor keep "
            "an optimizer per adapter.",
            hint="Train several policies with --backbone local, or remove the policies: section to train one "
                 "policy for every agent here."))
    elif config.policies.adapters:  # one: Trinity's LoRA, which its vLLM servers would not sample from
        problems.append(UserError(
            f"policies.adapters defines one policy ({next(iter(config.policies.adapters))}), a LoRA adapter, but "
            "with agenttune workflows Trinity-RFT cannot train one: the gateway asks Trinity's vLLM server for the "
            "base model by name, so the adapter would be trained but never sampled from (as with "
            "trinity.model.lora_configs).",
            hint="Remove the policies: section (full-weight training), or train the adapter with --backbone verl "
                 "or local."))
    problems += engine_problems(config)
    problems += tinker_mode_problems(config)
    passthrough = config.section("trinity", TrinityOptions).root
    if (passthrough.get("algorithm") or {}).get("rollout_correction"):
        problems.append(UserError(
            "trinity.algorithm.rollout_correction is not applied by Trinity-RFT 0.6.0: its trainer hands it to "
            "verl's own bypass_mode loss, which Trinity replaces with its policy losses (they take no importance "
            "weights or rejection masks), so the correction would be silently dropped.",
            hint="Remove trinity.algorithm.rollout_correction; agenttune's algorithm.rollout_correction.bypass_mode: "
                 "true is what Trinity runs (π_old from the engine's log-probs), or use --backbone local or verl "
                 "for importance weights and rejection."))
    if (passthrough.get("model") or {}).get("lora_configs"):
        problems.append(UserError(
            "trinity.model.lora_configs is not supported with agenttune workflows: the gateway asks Trinity's "
            "vLLM server for the base model by name, so a LoRA adapter would be trained but never sampled from.",
            hint="Remove trinity.model.lora_configs (full-weight training), or train LoRA with --backbone local."))
    return problems


def tinker_mode_problems(config: AgentTuneConfig) -> list[UserError]:
    """What Trinity-RFT 0.6.0's Tinker mode (the CPU path) cannot run."""
    if not tinker_mode(config) or not config.trainer.save_freq:
        return []
    # trinity/trainer/trainer.py skips the weight sync of a step that saves a checkpoint ("save_checkpoint is a
    # superset of save_state_dict"), which holds for its verl trainer but not for its Tinker trainer: the
    # explorer would wait for weights that never come.
    return [UserError(
        f"trainer.save_freq={config.trainer.save_freq} with Trinity's Tinker mode: Trinity-RFT 0.6.0 skips the "
        "weight sync of every step that saves a checkpoint, and its Tinker trainer's checkpoint does not hand the "
        "new weights to the explorer, so the run would stop at the first save, waiting for them.",
        hint="Leave trainer.save_freq at 0 with trinity.model.tinker.enable: the final state is still saved, and "
             "--resume continues from it.")]


def engine_problems(config: AgentTuneConfig) -> list[UserError]:
    """The `engine:` section configures agenttune's own inference engine (local and debug backbones); with
    Trinity, its explorer's vLLM engines generate, so an engine or engine options that would be ignored are
    refused."""
    engine = config.engine
    if engine.type not in TRINITY_ENGINES:
        return [UserError(
            f"engine.type={engine.type!r} is not used by the trinity backbone: Trinity-RFT's own vLLM rollout "
            "engines generate every episode (explorer.rollout_model.engine_type: vllm), so the run would not "
            "sample from that engine.",
            hint="Remove engine.type (or set hf or vllm) for --backbone trinity, or use --backbone local to sample "
                 "with that engine.")]
    if engine.options():
        names = ", ".join(f"engine.{name}" for name in sorted(engine.options()))
        return [UserError(
            f"{names} configure agenttune's own inference engine, which the trinity backbone does not run: "
            "Trinity-RFT's vLLM rollout engines generate, configured by its explorer.rollout_model keys.",
            hint="Remove them for --backbone trinity and set Trinity's own keys in the trinity: section instead "
                 "(e.g. trinity: {explorer: {rollout_model: {gpu_memory_utilization: 0.8}}}).")]
    return []
