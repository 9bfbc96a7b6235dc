"""Compose a complete verl config: verl's own Hydra files + the translation table + the `verl:` section.

The base is composed from `verl/trainer/config/ppo_trainer.yaml` exactly as `verl.trainer.main_ppo`
composes it. Translated keys are set in Hydra's struct mode, so a key verl does not have is an error.
The user's `verl:` section is applied last and may be written nested or with dotted keys; like a
Hydra command-line override, a key that verl's config does not have must be prefixed with `+`
(`"+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": 4`), so that typos are caught.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from agenttune.plugin_api import AgentTuneConfig, UserError
from agenttune_verl.options import VerlOptions
from agenttune_verl.translation import VerlPaths, translated_values

VERL_CONFIG_MODULE = "verl.trainer.config"
VERL_CONFIG_NAME = "ppo_trainer"


def compose_verl_base() -> Any:
    """verl's default PPO trainer config (an OmegaConf DictConfig in struct mode)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=VERL_CONFIG_MODULE, version_base=None):
            return compose(config_name=VERL_CONFIG_NAME)
    finally:
        GlobalHydra.instance().clear()


def build_verl_config(config: AgentTuneConfig, paths: VerlPaths) -> Any:
    """The DictConfig that verl's trainer will run with (interpolations left for verl to resolve)."""
    from omegaconf import OmegaConf

    verl_config = compose_verl_base()
    for key, value in translated_values(config, paths).items():
        # struct mode: raises if verl 0.9.1 has no such key (a bug in our table, not a user error)
        OmegaConf.update(verl_config, key, value, merge=False)
    passthrough = config.section("verl", VerlOptions).root
    apply_passthrough(verl_config, passthrough)
    if runs_on_cpu(verl_config):
        apply_cpu_settings(verl_config)
        apply_passthrough(verl_config, passthrough)  # again: the user's own keys win over the CPU settings
    check_async_support(config, verl_config)
    check_teacher_pool(verl_config)
    return verl_config


def runs_on_cpu(verl_config: Any) -> bool:
    """`verl.trainer.device=cpu`: the user's switch for a run without GPUs (cpu.py)."""
    return str(verl_config.trainer.device).lower() == "cpu"


def apply_cpu_settings(verl_config: Any) -> None:
    from omegaconf import OmegaConf, open_dict

    from agenttune_verl.cpu import settings

    with open_dict(verl_config):  # override_config is a free-form dict in verl's config
        for key, value in settings().items():
            OmegaConf.update(verl_config, key, value, merge=True)


def teacher_gpus(config: AgentTuneConfig) -> int:
    """The GPUs verl takes for a distillation teacher, beside the actor's (0 without distillation)."""
    if config.algorithm.policy_loss != "distillation":
        return 0
    section = build_verl_config(config, VerlPaths.placeholder(config)).distillation
    return int(section.nnodes) * int(section.n_gpus_per_node)


def check_teacher_pool(verl_config: Any) -> None:
    """verl serves a distillation teacher on GPUs of its own, which only the user can size; verl's own
    config class then checks that the teacher's replicas fill them."""
    section = verl_config.distillation
    if not section.enabled:
        return
    hint = ("Give the teacher its own GPUs in the verl: section, e.g. `verl: {distillation: {nnodes: 1}}` "
            "(distillation.n_gpus_per_node defaults to trainer.n_gpus_per_node; the teacher's tensor parallel size "
            "is distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size), or train this "
            "objective with --backbone local.")
    if section.nnodes <= 0:
        raise UserError(
            "algorithm.policy_loss: distillation on verl needs GPUs for the teacher: verl 0.9.1 serves the teacher "
            "in a resource pool of its own (distillation.nnodes x distillation.n_gpus_per_node), beside the "
            "actor's trainer.nnodes x trainer.n_gpus_per_node, and distillation.nnodes is 0.", hint=hint)
    from hydra.errors import InstantiationException
    from verl.utils.config import omega_conf_to_dataclass

    try:
        omega_conf_to_dataclass(section)
    except (ValueError, InstantiationException) as error:  # Hydra wraps the config class's ValueError
        reason = error.__cause__ if isinstance(error.__cause__, ValueError) else error
        raise UserError(f"verl 0.9.1 refuses the distillation section: {reason}", hint=hint) from error


def check_async_support(config: AgentTuneConfig, verl_config: Any) -> None:
    """Asynchronous modes need verl's V1 trainer: its legacy trainer would silently run synchronously."""
    if config.trainer.mode == "sync" or verl_config.trainer.use_v1:
        return
    raise UserError(
        f"trainer.mode={config.trainer.mode!r} cannot run on verl's legacy trainer (verl.trainer.use_v1 = false "
        "in the verl: section): in verl 0.9.1 only the V1 trainer has asynchronous modes "
        "(trainer.v1.trainer_mode colocate_async / separate_async, in verl.trainer.main_ppo); the legacy "
        "trainer would roll out and train synchronously. verl's experimental one_step_off_policy and "
        "fully_async_policy entry points are legacy trainers that agenttune does not launch.",
        hint="Remove `trainer.use_v1: false` from the verl: section (the V1 trainer is verl's default), or "
             "set trainer.mode=sync to keep the legacy trainer.")


def apply_passthrough(verl_config: Any, passthrough: dict[str, Any]) -> None:
    """Apply the user's `verl:` section on top, verbatim."""
    from omegaconf import OmegaConf, open_dict

    for key, value, is_new in _flatten(passthrough):
        if not is_new and not has_key(verl_config, key):
            raise UserError(_unknown_key_message(verl_config, key), hint=(
                f"Check the spelling against `agenttune config show --backbone verl`; to add a key that verl's "
                f"config does not define (a free-form engine option, say), write it as \"+{key}\"."))
        with open_dict(verl_config):  # as Hydra does for `+key=value` overrides
            OmegaConf.update(verl_config, key, value, merge=False)


def has_key(verl_config: Any, key: str) -> bool:
    """Whether verl's config defines `key` (also when its value is `???`, mandatory but unset)."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(verl_config, parent, default=None) if parent else verl_config
    return OmegaConf.is_dict(node) and leaf in node.keys()


def _flatten(node: dict[str, Any], prefix: str = "", is_new: bool = False) -> Iterator[tuple[str, Any, bool]]:
    """Yield (dotted key, value, is_new) for the leaves; a `+`-prefixed key adds its whole value as is."""
    for raw_key, value in node.items():
        key = str(raw_key)
        new_here = is_new or key.startswith("+")
        dotted = f"{prefix}{key.lstrip('+')}"
        if isinstance(value, dict) and value and not key.startswith("+"):
            yield from _flatten(value, f"{dotted}.", new_here)
        else:
            yield dotted, value, new_here


def _unknown_key_message(verl_config: Any, key: str) -> str:
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(verl_config, parent, default=None) if parent else verl_config
    siblings = [str(name) for name in node.keys()] if OmegaConf.is_dict(node) else []
    guess = difflib.get_close_matches(leaf, siblings, n=1)
    suggestion = f" Did you mean {'.'.join(filter(None, [parent, guess[0]]))!r}?" if guess else ""
    return f"verl.{key}: verl 0.9.1's config has no key {key!r}.{suggestion}"


def resolved(verl_config: Any) -> dict[str, Any]:
    """Plain data with interpolations resolved: what verl will actually use."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(verl_config, resolve=True, throw_on_missing=False)
