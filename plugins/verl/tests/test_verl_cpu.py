"""The CPU path's pieces (agenttune_verl/cpu.py), each against verl 0.9.1 itself; test_cpu_run.py runs them together."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from agenttune_verl.cpu import ROLLOUT_NAME, VERL_VERSION, check_verl_version
from agenttune_verl.translation import VerlPaths
from agenttune_verl.verl_config import build_verl_config

from agenttune.plugin_api import UserError

# Run in a fresh process with VERL_PLATFORM=cpu: verl loads agenttune's `verl.plugins` entry point on import.
IN_VERL = """
import json, torch, torch.distributed as dist, verl
from verl.utils.device import get_device_name, get_device_id, get_nccl_backend, get_torch_device
from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine.base import EngineRegistry
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1")
initialize_global_process_group_ray()
print(json.dumps({
    "device": get_device_name(), "device_id": get_device_id(), "backend": get_nccl_backend(),
    "process_group": dist.get_backend(), "memory": get_torch_device().max_memory_allocated(),
    "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
    "adapter": get_rollout_class("agenttune_hf", "async").__name__,
    "replica": RolloutReplicaRegistry.get("agenttune_hf").__name__,
    "tensor": str(torch.zeros(1).to(get_device_id()).device),
}))
dist.destroy_process_group()
"""


def run_in_verl(platform: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "VERL_PLATFORM": platform}
    return subprocess.run([sys.executable, "-c", IN_VERL], capture_output=True, text=True, env=env, timeout=300)


def test_verl_loads_the_cpu_platform_fsdp_engine_gloo_and_hf_rollout_through_its_plugin_entry_point():
    result = run_in_verl("cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"device": "cpu", "device_id": "cpu", "backend": "gloo", "process_group": "gloo",
                    "memory": seen["memory"], "engine": "FSDPEngineWithLMHead", "adapter": "HFServerAdapter",
                    "replica": "HFReplica", "tensor": "cpu"}
    assert seen["memory"] > 0  # the process's memory stands in for the device's


def test_without_the_switch_verl_is_left_as_it_is():
    import os

    env = {key: value for key, value in os.environ.items() if key != "VERL_PLATFORM"}
    code = ("import verl\nfrom verl.workers.rollout.replica import RolloutReplicaRegistry\n"
            "from verl.utils.distributed import initialize_global_process_group_ray as f\n"
            "print(sorted(RolloutReplicaRegistry._registry), f.__defaults__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "['sglang', 'trtllm', 'vllm'] (None, None)"


def test_the_switch_sets_what_a_cpu_run_needs_and_the_verl_section_still_wins(agent_config):
    config = agent_config("verl.trainer.device=cpu", "verl.actor_rollout_ref.rollout.agent.num_workers=2")
    verl_config = build_verl_config(config, VerlPaths.placeholder(config))
    rollout, actor, model = (verl_config.actor_rollout_ref.rollout, verl_config.actor_rollout_ref.actor,
                             verl_config.actor_rollout_ref.model)
    assert rollout.name == ROLLOUT_NAME and rollout.dtype == "float32"
    assert actor.strategy == "fsdp2" and actor.fsdp_config.dtype == "float32"
    assert model.override_config.attn_implementation == "sdpa" and model.use_remove_padding is False
    assert rollout.agent.num_workers == 2  # the user's own key, over the CPU setting of 1
    gpu_config = build_verl_config(agent_config(), VerlPaths.placeholder(config))
    assert gpu_config.actor_rollout_ref.rollout.name == "vllm"


def test_another_verl_version_is_refused_in_one_paragraph(monkeypatch):
    import importlib.metadata

    check_verl_version()  # the pinned one passes
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.9.2")
    with pytest.raises(UserError) as raised:
        check_verl_version()
    message = raised.value.render()
    assert f"verl {VERL_VERSION}" in message and "verl 0.9.2" in message and "\n\n" not in message.strip()


def test_the_gpu_check_points_to_the_cpu_switch(agent_config):
    from agenttune_verl.launch import check_gpus

    with pytest.raises(UserError) as raised:
        check_gpus(agent_config(), {"CPU": 2}, where="started on this machine")
    assert "verl.trainer.device=cpu" in raised.value.render()
