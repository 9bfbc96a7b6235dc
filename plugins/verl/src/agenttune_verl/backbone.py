"""The `verl` backbone: agenttune config in, a verl 0.9.1 GRPO run on a Ray GPU cluster out."""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from agenttune.plugin_api import AgentTuneConfig, Backbone, Run, UserError, missing_validation_split
from agenttune_verl.objectives import objective_problems
from agenttune_verl.options import VerlOptions
from agenttune_verl.policies import policy_problems
from agenttune_verl.translation import VerlPaths, total_gpus

# verl's FSDP optimiser schedules (verl.workers.config.FSDPOptimizerConfig)
VERL_LR_SCHEDULES = ("constant", "cosine")
# engine.type values that say what verl does anyway: its own vLLM servers generate (hf: the default)
VERL_ENGINES = ("hf", "vllm")


class VerlBackbone(Backbone):
    name: ClassVar[str] = "verl"
    description: ClassVar[str] = "GRPO on a Ray GPU cluster through verl 0.9.1 (vLLM rollouts, FSDP training)."
    Options: ClassVar[type[VerlOptions]] = VerlOptions

    @classmethod
    def check(cls, config: AgentTuneConfig) -> None:
        """Config-level checks only: GPUs are counted when the run joins its Ray cluster."""
        require_verl()
        problems = config_problems(config)
        if problems:
            raise problems[0]
        from agenttune_verl.verl_config import build_verl_config

        # before any file is written: typos in the verl: section, modes the resulting trainer cannot run
        build_verl_config(config, VerlPaths.placeholder(config))

    @classmethod
    def native_config(cls, config: AgentTuneConfig) -> dict[str, Any]:
        """The complete verl config (resolved); run-specific paths are shown as `<run_dir>/...`."""
        require_verl()
        from agenttune_verl.verl_config import build_verl_config, resolved

        return resolved(build_verl_config(config, VerlPaths.placeholder(config)))

    def run(self, run: Run) -> None:
        from agenttune.plugin_api import resolve
        from agenttune_verl.cpu import check_verl_version
        from agenttune_verl.launch import prepare, ray_cluster, run_trainer
        from agenttune_verl.verl_config import build_verl_config, runs_on_cpu

        components = run.components or resolve(run.config)  # what `agenttune train` resolved, else once here
        on_cpu = runs_on_cpu(build_verl_config(run.config, VerlPaths.placeholder(run.config)))
        if on_cpu:
            check_verl_version()  # before Ray starts: the CPU patches are written for one verl version
        prepare(run, components)
        with ray_cluster(run.config, on_cpu=on_cpu) as address:
            run_trainer(run, address, on_cpu=on_cpu)


def require_verl() -> None:
    if importlib.util.find_spec("verl") is None:
        raise UserError("The verl backbone needs verl 0.9.1, which is not installed in this environment.",
                        hint="pip install 'agenttune-plugin-verl[gpu]' (or 'verl[verl-core]==0.9.1' on a "
                             "machine without GPUs, enough for `config show`).")


def config_problems(config: AgentTuneConfig) -> list[UserError]:
    problems = []
    if not config.model.path:
        problems.append(UserError("model.path is not set: verl needs the model to train.",
                                  hint="Set model.path to a Hugging Face model id or a local model directory."))
    elif config.model.path.startswith("tiny://"):
        problems.append(UserError(f"model.path={config.model.path!r}: verl loads real model directories, not "
                                  "agenttune's tiny:// test models.",
                                  hint="Write one with `agenttune model init-tiny DIR` and set model.path=DIR."))
    problems += engine_problems(config)
    if config.trainer.lr_schedule not in VERL_LR_SCHEDULES:
        problems.append(UserError(f"trainer.lr_schedule={config.trainer.lr_schedule!r} is not available in verl.",
                                  hint=f"Use one of {', '.join(VERL_LR_SCHEDULES)}."))
    episodes = config.data.train_batch_size * config.rollout.num_repeat
    if total_gpus(config) == 0:
        problems.append(UserError("trainer.n_gpus_per_node=0: verl trains on GPUs.",
                                  hint="Set trainer.n_gpus_per_node to the GPUs per node (e.g. 8), or use "
                                       "--backbone local to train on CPU."))
    elif episodes % total_gpus(config):
        problems.append(UserError(
            f"data.train_batch_size x rollout.num_repeat = {episodes} episodes per step do not split evenly over "
            f"{total_gpus(config)} GPUs (trainer.n_gpus_per_node x trainer.nnodes).",
            hint="Make data.train_batch_size x rollout.num_repeat a multiple of the number of GPUs."))
    if validation := missing_validation_split(config):
        problems.append(validation)
    problems += objective_problems(config)
    problems += policy_problems(config)
    return problems


def engine_problems(config: AgentTuneConfig) -> list[UserError]:
    """The `engine:` section configures agenttune's own inference engine (local and debug backbones); with verl,
    verl's vLLM servers generate, so an engine or engine options that would be ignored are refused."""
    engine = config.engine
    if engine.type not in VERL_ENGINES:
        return [UserError(
            f"engine.type={engine.type!r} is not used by the verl backbone: verl's own vLLM servers generate every "
            "episode (actor_rollout_ref.rollout.name: vllm), so the run would not sample from that engine.",
            hint="Remove engine.type (or set hf or vllm) for --backbone verl, or use --backbone local to sample "
                 "with that engine.")]
    if engine.options():
        names = ", ".join(f"engine.{name}" for name in sorted(engine.options()))
        return [UserError(
            f"{names} configure agenttune's own inference engine, which the verl backbone does not run: verl's vLLM "
            "servers generate, configured by verl's actor_rollout_ref.rollout keys.",
            hint="Remove them for --backbone verl and set verl's own rollout keys in the verl: section instead "
                 "(e.g. verl: {actor_rollout_ref: {rollout: {gpu_memory_utilization: 0.6}}}).")]
    return []
