"""Launching a verl training run from an agenttune run directory.

    <run_dir>/verl/train.parquet, validation.parquet   the tasks, as verl dataset rows (dataset.py)
    <run_dir>/verl/agent_loops.yaml                    registers the agenttune agent loop
    <run_dir>/verl/ppo_agenttune.yaml                  the complete verl config (verl_config.py)
    <run_dir>/verl/trainer.log                         verl's console output
    <run_dir>/verl/metrics.jsonl                       verl's per-step metrics (its "file" logger)
    <run_dir>/metrics.jsonl, rollouts/                 agenttune's step metrics and rollout log
    <run_dir>/checkpoints/, tensorboard/               verl's checkpoints and TensorBoard events

Ray: with `ray.address` set the run joins that cluster; otherwise a local Ray head is started in this
process for the duration of the run. Either way the cluster's GPUs are counted before verl starts, so
a machine without GPUs fails here with a clear message instead of deep inside verl — unless the run asks
for the CPU (`verl.trainer.device=cpu`, cpu.py): then the local head declares one logical GPU per trainer
rank. verl's trainer (`python -m verl.trainer.main_ppo`) then runs in a child process attached to the same
cluster. `--resume` continues from verl's latest checkpoint (`trainer.resume_mode: auto`); without it a run
directory that holds a run is refused.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from agenttune.plugin_api import (
    AgentTuneConfig,
    Components,
    MetricsLog,
    RolloutLog,
    Run,
    UserError,
    get_logger,
)
from agenttune_verl.cpu import PLATFORM, ray_resources
from agenttune_verl.dataset import write_tasks
from agenttune_verl.metrics_bridge import MetricsFollower
from agenttune_verl.options import RayOptions
from agenttune_verl.translation import AGENT_LOOP_NAME, VerlPaths, total_gpus
from agenttune_verl.verl_config import build_verl_config, runs_on_cpu, teacher_gpus

log = get_logger("verl.launch")

CONFIG_NAME = "ppo_agenttune"
TRAINER_ENTRY = "verl.trainer.main_ppo"
VERL_LATEST_CHECKPOINT = "latest_checkpointed_iteration.txt"  # verl's pointer to its newest checkpoint


def verl_dir(run: Run) -> Path:
    return run.run_dir.resolve() / "verl"


def prepare(run: Run, components: Components) -> VerlPaths:
    """Write the datasets, the agent-loop registration and the verl config into the run directory."""
    config = run.config
    has_validation = config.task_reader.validation_split is not None
    paths = VerlPaths.for_run(run.run_dir, has_validation=has_validation)
    write_datasets(config, components, paths)
    write_agent_loop_config(Path(paths.agent_loop_config), run)
    write_verl_config(run, paths)
    return paths


def write_datasets(config: AgentTuneConfig, components: Components, paths: VerlPaths) -> None:
    data_source = f"agenttune/{config.task_reader.type}"
    split = config.task_reader.train_split
    count = write_tasks(components.read_tasks(split), Path(paths.train_files), split="train", data_source=data_source)
    if count < config.data.train_batch_size:
        raise UserError(
            f"The train split {split!r} has {count} tasks, fewer than data.train_batch_size="
            f"{config.data.train_batch_size}: verl drops incomplete batches, so it would train for 0 steps.",
            hint="Lower data.train_batch_size or add tasks.")
    if config.task_reader.validation_split is not None:
        # data.val_batch_size: validate on the first N tasks of the split, as the local backbone does
        validation = components.read_tasks(config.task_reader.validation_split, limit=config.data.val_batch_size)
        write_tasks(validation, Path(paths.val_files), split="validation", data_source=data_source)
    log.info("tasks written for verl", train=count, path=paths.train_files)


def write_agent_loop_config(path: Path, run: Run) -> None:
    """The YAML verl's agent-loop workers read (`rollout.agent.agent_loop_config_path`)."""
    source_dir = run.config.source_dir
    entry = {
        "name": AGENT_LOOP_NAME,
        "_target_": "agenttune_verl.agent_loop.AgentTuneAgentLoop",
        "agenttune_config": str(run.run_dir.resolve() / "config.yaml"),
        "source_dir": str(source_dir) if source_dir else None,
        "run_dir": str(run.run_dir.resolve()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump([entry], sort_keys=False), encoding="utf-8")


def write_verl_config(run: Run, paths: VerlPaths) -> Path:
    from omegaconf import OmegaConf, open_dict

    verl_config = build_verl_config(run.config, paths)
    on_cpu = runs_on_cpu(verl_config)
    # Every Ray worker, on any node, needs these (verl merges ray_init.runtime_env into ray.init).
    with open_dict(verl_config):
        verl_config.trainer.resume_mode = resume_mode(run)
        runtime_env = verl_config.ray_kwargs.ray_init.runtime_env
        runtime_env.env_vars = {**runtime_env.get("env_vars", {}), **trainer_env(run, on_cpu=on_cpu)}
    path = verl_dir(run) / f"{CONFIG_NAME}.yaml"
    OmegaConf.save(verl_config, path)
    return path


def resume_mode(run: Run) -> str:
    """verl resumes from the latest checkpoint in `trainer.default_local_dir` by itself (`auto`); agenttune
    does so on `--resume` only, and refuses to train over an earlier run, as the local backbone does."""
    latest = run.checkpoints_dir / VERL_LATEST_CHECKPOINT
    if run.resume:
        if not latest.is_file():
            raise UserError(f"--resume: there is no verl checkpoint in {str(run.checkpoints_dir)!r}.",
                            hint="Start without --resume, or pass the --run-dir of a run that saved checkpoints "
                                 "(trainer.save_freq).")
        return "auto"
    if latest.is_file() or MetricsLog(run.metrics_path).read():
        raise UserError(f"The run directory {str(run.run_dir)!r} already holds a training run.",
                        hint="Pass --resume to continue it, or choose a new --run-dir.")
    return "disable"


def trainer_env(run: Run, *, on_cpu: bool) -> dict[str, str]:
    env = {
        "VERL_FILE_LOGGER_PATH": str(verl_dir(run) / "metrics.jsonl"),
        "TENSORBOARD_DIR": str(run.run_dir.resolve() / "tensorboard"),
    }
    if on_cpu:  # verl's processes pick the cpu platform that agenttune_verl.cpu registers
        env["VERL_PLATFORM"] = PLATFORM
    return env


@contextmanager
def ray_cluster(config: AgentTuneConfig, *, on_cpu: bool = False) -> Iterator[str]:
    """Join `ray.address` or start a local Ray head; check its GPUs; yield the address verl should join.
    On CPU (`verl.trainer.device=cpu`) a local head declares one logical GPU per trainer rank."""
    import ray

    address = config.section("ray", RayOptions).address
    where = f"at {address}" if address else "started on this machine"
    earlier = _descendants()  # processes that are not Ray's: left alone when the head stops
    try:
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        elif on_cpu:
            ray.init(include_dashboard=False, **ray_resources(total_gpus(config)))
        else:
            ray.init(include_dashboard=False)
    except Exception as error:
        action = f"join the Ray cluster {where}" if address else "start a local Ray head"
        raise UserError(f"Could not {action}: {type(error).__name__}: {error}.",
                        hint="Check ray.address (e.g. 'ray://head:10001', or 'auto' after `ray start --head`).",
                        ) from error
    try:
        check_gpus(config, ray.cluster_resources(), where=where)
        if address:
            ray.shutdown()  # verl connects on its own; this process only looked
            yield address
        else:
            yield ray.get_runtime_context().gcs_address
    finally:
        if ray.is_initialized():
            stop_ray(earlier if address is None else None)


def stop_ray(earlier: set[int] | None, *, grace_s: float = 20.0) -> None:
    """Shut Ray down; for a head started here (`earlier`: the processes that were there before it), also wait
    for its processes (verl's actors notice the head is gone only seconds later) and end those that outlive
    the grace period, so that none outlives the run."""
    import psutil
    import ray

    ray_processes = [process for process in psutil.Process().children(recursive=True)
                     if earlier is not None and process.pid not in earlier]
    ray.shutdown()
    _, alive = psutil.wait_procs(ray_processes, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=5)


def _descendants() -> set[int]:
    import psutil

    return {process.pid for process in psutil.Process().children(recursive=True)}


def check_gpus(config: AgentTuneConfig, resources: dict[str, Any], *, where: str) -> None:
    teacher = teacher_gpus(config)
    needed = total_gpus(config) + teacher
    available = int(resources.get("GPU", 0))
    if available < needed:
        teacher_part = f" + {teacher} for the distillation teacher (verl: distillation.*)" if teacher else ""
        raise UserError(
            f"The verl backbone needs GPUs: the config asks for {needed} (trainer.n_gpus_per_node="
            f"{config.trainer.n_gpus_per_node} x trainer.nnodes={config.trainer.nnodes}{teacher_part}), but the "
            f"Ray cluster {where} has {available}.",
            hint="Run on a machine with NVIDIA GPUs or join a GPU cluster with ray.address=..., lower "
                 "trainer.n_gpus_per_node / trainer.nnodes, or try this verl run on the CPU first with "
                 "verl.trainer.device=cpu (a small model: see 'Trying a run on CPU' in the verl plugin's README), "
                 "or train here with --backbone local or --backbone debug.")


def trainer_command(run: Run) -> list[str]:
    hydra_dir = verl_dir(run) / "hydra"
    return [sys.executable, "-m", TRAINER_ENTRY, "--config-path", str(verl_dir(run)), "--config-name", CONFIG_NAME,
            f"hydra.run.dir={_hydra_quote(str(hydra_dir))}"]


def run_trainer(run: Run, ray_address: str, *, command: list[str] | None = None, on_cpu: bool = False) -> None:
    """Run verl's trainer (or `command`) to completion, teeing its output and bridging its metrics."""
    command = command or trainer_command(run)
    env = {**os.environ, "RAY_ADDRESS": ray_address, **trainer_env(run, on_cpu=on_cpu)}
    trainer_log = verl_dir(run) / "trainer.log"
    set_aside_earlier_metrics(verl_dir(run) / "metrics.jsonl")
    follower = MetricsFollower(verl_dir(run) / "metrics.jsonl", RolloutLog.for_run(run),
                               MetricsLog(run.metrics_path))
    log.info("starting verl", command=" ".join(command), ray_address=ray_address)
    with follower, trainer_log.open("a", encoding="utf-8") as log_file:
        process = subprocess.Popen(command, cwd=run.run_dir, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            for line in process.stdout or ():
                sys.stdout.write(line)
                log_file.write(line)
            code = process.wait()
        except BaseException:  # Ctrl-C: stop verl too, rather than leave it training unattended
            process.terminate()
            process.wait()
            raise
    if code != 0:
        raise UserError(f"verl's trainer exited with code {code}.",
                        hint=f"Its output is above and in {trainer_log}; the config it ran is "
                             f"{verl_dir(run) / (CONFIG_NAME + '.yaml')}.")


def set_aside_earlier_metrics(path: Path) -> None:
    """A resumed run: verl rewrites its metrics file from scratch, and the steps in it are in the run's
    metrics.jsonl already; the file is kept as metrics.<n>.jsonl, and the follower reads only the new one."""
    if not path.exists():
        return
    number = 1
    while (earlier := path.with_suffix(f".{number}.jsonl")).exists():
        number += 1
    path.rename(earlier)


def _hydra_quote(value: str) -> str:
    """A value for a Hydra command-line override (paths may hold characters its grammar reserves)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
