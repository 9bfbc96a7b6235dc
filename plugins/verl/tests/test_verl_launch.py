"""Launching: files in the run directory, verl's own entry point reading them, the GPU check, metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agenttune_verl.launch import CONFIG_NAME, prepare, trainer_command, verl_dir
from agenttune_verl.metrics_bridge import MetricsFollower
from agenttune_verl.outputs import FAILED_EPISODE_DROPPED
from agenttune_verl.rollout_files import LockedRolloutLog
from conftest import CALCULATOR, load_like_main_ppo

from agenttune.plugin_api import (
    Episode,
    EpisodeStatus,
    MetricsLog,
    RolloutLog,
    Sample,
    Task,
    prepare_run,
    resolve,
)


def test_verls_entry_point_accepts_the_written_config(agent_config, tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = agent_config()
    run = prepare_run(config, tmp_path / "run")
    prepare(run, resolve(config))
    for name in ("train.parquet", "validation.parquet", "agent_loops.yaml", f"{CONFIG_NAME}.yaml"):
        assert (verl_dir(run) / name).is_file(), name

    loaded = load_like_main_ppo(run)
    validate_config(loaded, use_reference_policy=need_reference_policy(loaded), use_critic=need_critic(loaded))
    env_vars = loaded.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.VERL_FILE_LOGGER_PATH == str(verl_dir(run) / "metrics.jsonl")

    # verl's real entry point parses the file (Hydra's --cfg prints the composed job config and exits)
    result = subprocess.run([*trainer_command(run), "--cfg", "job"], capture_output=True, text=True,
                            cwd=run.run_dir, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = result.stdout
    assert "adv_estimator: grpo" in printed
    assert f"agent_loop_config_path: {verl_dir(run) / 'agent_loops.yaml'}" in printed


def test_train_on_a_machine_without_gpus_stops_at_the_gpu_check(agent_config, tmp_path):
    config = agent_config()
    conf = tmp_path / "train.yaml"
    conf.write_text(json.dumps({**config.model_dump(mode="json"), "workflow": CALCULATOR}))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(config.source_dir), os.environ.get("PYTHONPATH", "")]),
           "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run([sys.executable, "-m", "agenttune", "train", "--conf", str(conf), "--backbone", "verl",
                             "--run-dir", str(run_dir)], capture_output=True, text=True, env=env, timeout=600)

    assert result.returncode == 2, result.stderr[-3000:]
    assert "The verl backbone needs GPUs: the config asks for 1" in result.stderr
    assert "the Ray cluster started on this machine has 0" in result.stderr
    assert "Traceback" not in result.stderr
    # everything before the GPUs is done: the datasets and verl's config are in the run directory
    assert (run_dir / "verl" / "train.parquet").is_file()
    assert (run_dir / "verl" / f"{CONFIG_NAME}.yaml").is_file()


def episode(step_reward: float, *, truncated: float = 0.0, group: str = "g") -> Episode:
    sample = Sample(prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 0], logprobs=[-0.5, 0.0])
    return Episode(episode_id=f"{group}-{step_reward}", task=Task(task_id="t"), group_id=group,
                   reward=step_reward, success=step_reward > 0, samples=[sample],
                   metrics={"calls": 1.0, "truncation/response_tokens": truncated})


def test_metrics_bridge_joins_verls_metrics_and_the_steps_episodes(tmp_path, tiny_tokenizer):
    rollout_log = LockedRolloutLog(tmp_path / "rollouts")
    dropped = episode(0.5, group="x").model_copy(update={
        "status": EpisodeStatus.TIMEOUT, "success": False, "metrics": {FAILED_EPISODE_DROPPED: 1.0}})
    rollout_log.write(1, "train", [episode(1.0, truncated=3), episode(0.0), dropped], tiny_tokenizer)
    rollout_log.write(1, "validation", [episode(1.0, group="v")], tiny_tokenizer)
    verl_metrics = tmp_path / "verl" / "metrics.jsonl"
    verl_metrics.parent.mkdir()
    metrics_log = MetricsLog(tmp_path / "metrics.jsonl")

    with MetricsFollower(verl_metrics, RolloutLog(tmp_path / "rollouts"), metrics_log, poll_s=0.05) as follower:
        with verl_metrics.open("a") as file:
            file.write(json.dumps({"step": 1, "data": {"actor/pg_loss": 0.25, "critic/score/mean": 0.5,
                                                        "timing_s/gen": 3.0, "note": "text"}}) + "\n")
            file.write('{"step": 2, "data"')  # a line verl is still writing waits
        follower.poll()
        assert [record["step"] for record in metrics_log.read()] == [1]

    [step] = metrics_log.read()
    assert step["verl/actor/pg_loss"] == 0.25 and "verl/note" not in step
    assert step["reward/mean"] == 0.5 and step["success_rate"] == 1 / 3
    assert step["truncation/response_tokens"] == 3.0
    assert step["train/failed_episodes_skipped"] == 1.0  # the local backbone's name for the same count
    assert step["failures/timeout"] == 1.0
    assert step["val/reward/mean"] == 1.0


def test_rollout_log_appends_from_many_writers_stay_whole(tmp_path, tiny_tokenizer):
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        list(pool.map(_write_many, [str(tmp_path)] * 4))
    lines = (tmp_path / "rollouts" / "step_000001_train.jsonl").read_text().splitlines()
    assert len(lines) == 4 * 25
    assert all(json.loads(line)["status"] == EpisodeStatus.OK.value for line in lines)


def _write_many(directory: str) -> None:
    from agenttune.testing import tiny_tokenizer

    log = LockedRolloutLog(os.path.join(directory, "rollouts"))
    for index in range(25):
        log.write(1, "train", [episode(float(index))], tiny_tokenizer())


def test_the_trainer_joins_the_local_ray_head_and_its_metrics_reach_the_run(agent_config, tmp_path):
    from agenttune_verl.launch import ray_cluster, run_trainer

    config = agent_config("trainer.n_gpus_per_node=0")  # a CPU-only stand-in trainer passes the GPU count
    run = prepare_run(config, tmp_path / "run")
    (run.run_dir / "verl").mkdir()
    RolloutLog.for_run(run).write(1, "train", [episode(1.0)], None)
    stand_in = ("import json, os, ray\n"
                "ray.init()\n"  # RAY_ADDRESS, as verl's main_ppo calls it
                "print('joined', ray.get_runtime_context().gcs_address, flush=True)\n"
                "with open(os.environ['VERL_FILE_LOGGER_PATH'], 'a') as f:\n"
                "    f.write(json.dumps({'step': 1, 'data': {'actor/lr': 1e-6}}) + '\\n')\n")

    with ray_cluster(config) as address:
        run_trainer(run, address, command=[sys.executable, "-c", stand_in])

    trainer_log = (verl_dir(run) / "trainer.log").read_text()
    assert f"joined {address}" in trainer_log
    [step] = MetricsLog(run.metrics_path).read()
    assert step["step"] == 1 and step["verl/actor/lr"] == 1e-6 and step["reward/mean"] == 1.0


def test_a_failing_trainer_is_reported_with_its_log(agent_config, tmp_path):
    import pytest
    from agenttune_verl.launch import run_trainer

    from agenttune.plugin_api import UserError

    run = prepare_run(agent_config(), tmp_path / "run")
    (run.run_dir / "verl").mkdir()
    with pytest.raises(UserError, match="exited with code 3") as raised:
        run_trainer(run, "127.0.0.1:1", command=[sys.executable, "-c", "print('boom'); raise SystemExit(3)"])
    assert "trainer.log" in raised.value.render()
    assert "boom" in (verl_dir(run) / "trainer.log").read_text()
