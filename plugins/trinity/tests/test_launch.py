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
    assert "trinity.model.tinker.enable=true" in message  # the way to try the run on this machine
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
        "import sys\n"
        "sys.modules['vllm'] = None  # as if it were not installed (the CPU session installs it for the CPU run)\n"
        "from agenttune.plugin_api import UserError\n"
        "from agenttune_trinity.launch import require_vllm\n"
        "try:\n    require_vllm()\nexcept UserError as error:\n    print(error.render())\n",
        stub_vllm=False)
    assert result.returncode == 0, result.stderr
    assert "needs vLLM" in result.stdout and "agenttune-plugin-trinity[trinity]" in result.stdout


def test_tinker_mode_runs_on_a_named_server_and_starts_none(make_config, tmp_path: Path, monkeypatch):
    from agenttune_trinity.tinker_mode import tinker_server

    monkeypatch.setenv("TINKER_API_KEY", "tml-hosted")
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    config = make_config(trinity={"model": {"tinker": {"enable": True, "base_url": "http://tinker.example:8000"}}})
    with tinker_server(config, "/models/m", tmp_path) as server:
        assert (server.base_url, server.api_key) == ("http://tinker.example:8000", "tml-hosted")
        assert os.environ["TINKER_BASE_URL"] == "http://tinker.example:8000"  # for the actors Ray starts
    assert "TINKER_BASE_URL" not in os.environ
    assert not (tmp_path / "tinker").exists()
    with tinker_server(make_config(), "/models/m", tmp_path) as server:
        assert server is None  # Tinker mode off: the GPU path


def test_a_tinker_server_that_cannot_start_is_one_clear_error(make_config, tmp_path: Path):
    from agenttune_trinity.tinker_mode import tinker_server

    config = make_config(trinity={"model": {"tinker": {"enable": True}}})
    with pytest.raises(UserError) as caught, tinker_server(config, str(tmp_path / "no-such-model"), tmp_path):
        pass
    message = caught.value.render()
    assert "`agenttune tinker serve`" in message and "exited with status" in message
    assert str(tmp_path / "tinker" / "server.log") in message


def test_tinker_mode_translates_to_trinitys_both_mode_on_no_gpu(make_config):
    from agenttune_trinity.translation import TrinityPaths, trinity_config

    config = make_config(trinity={"model": {"tinker": {"enable": True, "rank": 8}}},
                         trainer={"n_gpus_per_node": 1, "learning_rate": 1e-3})
    native = trinity_config(config, TrinityPaths.placeholder(config))
    assert native["mode"] == "both"  # not colocate: the Tinker server holds the model, not a GPU
    assert "cluster" not in native  # Trinity asks Ray, which has no GPU to give
    assert native["model"]["tinker"] == {"enable": True, "rank": 8}


def test_checkpoints_during_a_tinker_mode_run_are_refused(make_config):
    """Trinity 0.6.0 skips the weight sync of a step that saves; its Tinker trainer's save does not sync."""
    from agenttune_trinity.backbone import TrinityBackbone

    with pytest.raises(UserError, match="trainer.save_freq=2 with Trinity's Tinker mode"):
        TrinityBackbone.check(make_config(trinity={"model": {"tinker": {"enable": True}}}, trainer={"save_freq": 2}))
    TrinityBackbone.check(make_config(trainer={"save_freq": 2}))  # the GPU path saves and syncs as usual


def test_another_trinity_version_is_refused_before_ray_starts(make_config, monkeypatch):
    import agenttune_trinity.backbone as backbone

    assert backbone.installed_trinity_version() == "0.6.0"  # the session's pin
    monkeypatch.setattr(backbone, "installed_trinity_version", lambda: "0.7.0")
    with pytest.raises(UserError) as caught:
        backbone.TrinityBackbone.check(make_config())
    message = caught.value.render()
    assert "written for Trinity-RFT 0.6.0" in message and "has 0.7.0" in message
    assert "pip install 'trinity-rft==0.6.0'" in message
