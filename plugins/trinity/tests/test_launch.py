"""Launching: the plugin is found cheaply, and a machine without GPUs gets one clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import VLLM_STUB

from agenttune.plugin_api import UserError


def run_python(code: str, *, stub_vllm: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path != str(VLLM_STUB)]
    env["PYTHONPATH"] = os.pathsep.join(([str(VLLM_STUB)] if stub_vllm else []) + paths)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_plugins_list_shows_trinity_without_importing_trinity_or_ray():
    result = run_python(
        "import json, sys\n"
        "from agenttune.plugin_api import get_plugin_manager\n"
        "infos = get_plugin_manager().infos()\n"
        "print(json.dumps({'backbones': sorted(b for info in infos for b in info.provides['backbones']),\n"
        "                  'problems': [info.problem for info in infos if info.name == 'trinity'],\n"
        "                  'heavy': [m for m in ('trinity', 'ray', 'vllm') if m in sys.modules]}))\n")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout.strip().splitlines()[-1])
    assert "trinity" in listed["backbones"]
    assert listed["problems"] == [None]
    assert listed["heavy"] == []


def test_train_without_gpus_fails_with_a_clear_message(make_config, tmp_path: Path):
    from agenttune.plugin_api import train_from_config

    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as caught:
        train_from_config(make_config(), run_dir=run_dir)
    message = caught.value.render()
    assert "The trinity backbone needs GPUs" in message
    assert "--backbone local" in message and "ray start --head" in message
    # the generated config was written first, so the user can read what would have run
    from agenttune_trinity.launch import load_trinity_config

    cfg = load_trinity_config(run_dir / "trinity" / "config.yaml")
    assert cfg.algorithm.repeat_times == 2


def test_more_gpus_asked_than_the_cluster_has_is_a_clear_error():
    from agenttune_trinity.launch import Cluster, require_gpus

    with pytest.raises(UserError, match="asks for 8 GPUs .* has 2"):
        require_gpus(Cluster("10.0.0.1:6379", 2.0, "the Ray cluster at 10.0.0.1:6379"), needed=8)
    require_gpus(Cluster(None, 8.0, "this machine"), needed=8)  # enough: no error


def test_missing_vllm_is_a_clear_error():
    result = run_python(
        "from agenttune.plugin_api import UserError\n"
        "from agenttune_trinity.launch import require_vllm\n"
        "try:\n    require_vllm()\nexcept UserError as error:\n    print(error.render())\n",
        stub_vllm=False)
    assert result.returncode == 0, result.stderr
    assert "needs vLLM" in result.stdout and "agenttune-plugin-trinity[trinity]" in result.stdout
