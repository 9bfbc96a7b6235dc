"""verl 0.9.1 on a CPU machine: the one place that adapts verl's internals to run without GPUs.

Selected with `verl.trainer.device=cpu` (the launcher then sets `VERL_PLATFORM=cpu` for verl's
processes). verl loads every `verl.plugins` entry point in each process that imports it; this module is
ours (plugins/verl/pyproject.toml), and does nothing unless `VERL_PLATFORM=cpu`. Then it:

- registers a `cpu` platform (`PlatformRegistry`, verl's extension point for new hardware): device
  "cpu", collectives on gloo, memory statistics from the process, Ray's logical GPUs as the accelerator
  resource (the local Ray head declares them, one per trainer rank);
- registers verl's FSDP engine for the "cpu" device (`EngineRegistry`; verl registers it for cuda and
  npu only, though it is plain torch);
- makes gloo the default backend of `initialize_global_process_group_ray` (verl builds
  `cpu:gloo,<device>:<backend>`, which names cpu twice when the device is cpu);
- registers the `agenttune_hf` rollout (`RolloutReplicaRegistry` and the rollout class table):
  agenttune's `hf` engine serving verl's agent loops, its weights pushed by verl's checkpoint engine
  (hf_rollout.py).

Each patch is written for verl 0.9.1 (`check_verl_version` refuses another version before Ray starts).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

from agenttune.plugin_api import UserError

VERL_VERSION = "0.9.1"
PLATFORM = "cpu"
ROLLOUT_NAME = "agenttune_hf"
ROLLOUT_ADAPTER = "agenttune_verl.hf_rollout.HFServerAdapter"


def selected() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


def check_verl_version() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("verl")
    except PackageNotFoundError:
        installed = "not installed"
    if installed != VERL_VERSION:
        raise UserError(
            f"verl.trainer.device=cpu runs verl on CPU by adapting a few of verl's internals (the process-group "
            f"backend, the FSDP engine's device registration, the rollout class table), written and tested for "
            f"verl {VERL_VERSION}; this environment has verl {installed}, whose internals may differ, so the run "
            f"would fail somewhere deep inside verl or train wrongly.",
            hint=f"pip install 'verl[verl-core]=={VERL_VERSION}' for the CPU run (the GPU path needs no such pin).")


class CPUDeviceModule:
    """What verl calls on `torch.cuda` (its `get_torch_device()`), for the CPU: no caches to empty,
    memory statistics from the process, the CPU generator's state."""

    def __getattr__(self, name: str) -> Any:  # streams, synchronize, device_count, ...: torch.cpu has them
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def current_device() -> str:
        return PLATFORM

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return _rss_bytes()

    max_memory_allocated = memory_reserved = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return PLATFORM

    @staticmethod
    def get_rng_state(device: Any = None) -> Any:
        import torch

        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: Any, device: Any = None) -> None:
        import torch

        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    manual_seed_all = manual_seed


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def platform_class() -> type:
    """The `cpu` platform (a class built here: its base is verl's, imported only when selected)."""
    from verl.plugin.platform import PlatformBase

    device = CPUDeviceModule()

    class PlatformCPU(PlatformBase):
        device_name = PLATFORM
        vendor_name = PLATFORM
        device_module = device

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:  # verl writes `.to(get_device_id())`: "cpu", not an index
            return PLATFORM

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            device.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            device.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPUs; nothing reads it on CPU

        def ray_resource_name(self) -> str:
            # verl places one trainer rank per accelerator; on CPU the Ray head declares logical GPUs
            # (launch.ray_cluster), one per rank, so verl's placement works unchanged.
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def cudart(self) -> None:
            return None

    return PlatformCPU


def register_platform() -> None:
    from verl.plugin.platform import PlatformRegistry

    PlatformRegistry.register(platform=PLATFORM)(platform_class())


def register_fsdp_engine() -> None:
    """verl's FSDP engines are plain torch (FSDP2 runs on gloo); verl registers them for cuda and npu only."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    engines = EngineRegistry._engines
    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        if PLATFORM not in engines.get(model_type, {}).get("fsdp2", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=PLATFORM)(engine)


def use_gloo_by_default() -> None:
    """verl 0.9.1's `initialize_global_process_group_ray(timeout_second=None, backend=None)` builds
    `cpu:gloo,<device>:<backend>` when no backend is passed, which on CPU is `cpu:gloo,cpu:gloo` and torch
    refuses ("Duplicate device type cpu"). Its callers pass none, so its default becomes gloo; the function
    object is shared by every module that imported it by name, so one change reaches them all."""
    from verl.utils import distributed

    function = distributed.initialize_global_process_group_ray
    if function.__defaults__ == (None, "gloo"):  # done already in this process
        return
    if function.__defaults__ != (None, None):
        raise RuntimeError(f"verl's initialize_global_process_group_ray has defaults {function.__defaults__}, "
                           f"not those of verl {VERL_VERSION}'s (None, None): the CPU patch does not fit.")
    function.__defaults__ = (None, "gloo")


def register_rollout() -> None:
    """agenttune's `hf` engine as a verl rollout: the replica (its server actors) through verl's registry, the
    adapter in the trainer's workers (which takes the checkpoint engine's weights) in verl's rollout table,
    which has no register function."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_replica() -> type:
        from agenttune_verl.hf_rollout import HFReplica

        return HFReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ROLLOUT_ADAPTER


def install() -> None:
    register_platform()
    register_fsdp_engine()
    use_gloo_by_default()
    register_rollout()


def settings() -> dict[str, Any]:
    """The verl keys a CPU run needs (applied before the `verl:` section, which may override them)."""
    fsdp = {"strategy": "fsdp2", "dtype": "float32", "use_torch_compile": False}
    return {
        "actor_rollout_ref.model.use_remove_padding": False,  # flash-attn's varlen path: CUDA only
        "actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa"},
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.actor.fsdp_config": fsdp,
        "actor_rollout_ref.ref.strategy": "fsdp2",
        "actor_rollout_ref.ref.fsdp_config": fsdp,
        "actor_rollout_ref.rollout.name": ROLLOUT_NAME,
        "actor_rollout_ref.rollout.dtype": "float32",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.load_format": "auto",
        "actor_rollout_ref.rollout.agent.num_workers": 1,
        "reward.num_workers": 1,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,  # each one a Ray actor process
        "data.dataloader_num_workers": 0,
    }


def ray_resources(n_ranks: int) -> dict[str, Any]:
    """A local Ray head for a CPU run: one logical GPU per trainer rank (verl's placement asks for them) and
    enough logical CPUs for verl's actors (each placement bundle reserves several)."""
    return {"num_gpus": n_ranks, "num_cpus": max(32, 16 * n_ranks)}


if selected():  # loaded by verl (its `verl.plugins` entry point) in every process that imports it
    install()
