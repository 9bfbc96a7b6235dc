"""The `trinity` backbone: GRPO on a Ray GPU cluster through Trinity-RFT 0.6.0."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, ClassVar

from agenttune.plugin_api import Backbone, UserError, missing_validation_split
from agenttune_trinity.options import TrinityOptions
from agenttune_trinity.translation import TrinityPaths, generated_config, trinity_config

if TYPE_CHECKING:
    from agenttune.plugin_api import AgentTuneConfig, Run


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


def require_trinity() -> None:
    if importlib.util.find_spec("trinity") is None:
        raise UserError("The trinity backbone needs Trinity-RFT 0.6.0, which is not installed in this environment.",
                        hint="pip install 'agenttune-plugin-trinity[trinity]' (Trinity-RFT with vLLM, for GPU "
                             "machines). It conflicts with the verl plugin's verl version: use its own environment.")


def config_problems(config: AgentTuneConfig) -> list[UserError]:
    problems = []
    if not config.model.path:
        problems.append(UserError("model.path is not set: Trinity-RFT needs the model to train.",
                                  hint="Set model.path to a Hugging Face model id or a local model directory."))
    if validation := missing_validation_split(config):
        problems.append(validation)
    if (config.section("trinity", TrinityOptions).root.get("model") or {}).get("lora_configs"):
        problems.append(UserError(
            "trinity.model.lora_configs is not supported with agenttune workflows: the gateway asks Trinity's "
            "vLLM server for the base model by name, so a LoRA adapter would be trained but never sampled from.",
            hint="Remove trinity.model.lora_configs (full-weight training), or train LoRA with --backbone local."))
    return problems
