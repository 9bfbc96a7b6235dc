"""Launching a Trinity-RFT run from an agenttune run directory.

What `trinity run --config X` does, in process, with agenttune's checks in front:

1. translate the agenttune config, write it to `<run_dir>/trinity/config.yaml` and load it back
   through Trinity's own `load_config` (Trinity's schema judges every key, passthrough included);
2. find the Ray cluster: join a running one (`cluster.ray_address`, default "auto": the cluster
   `ray start --head` started on this node) or, when there is none, start one inside this process;
3. make sure there are GPUs and vLLM, with one clear message each when not — unless Trinity's Tinker
   mode is on (`trinity.model.tinker.enable`, the CPU path): then an `agenttune tinker serve` is started
   first when no server is named, and Trinity samples and trains through it (tinker_mode.py);
4. write the tasksets from the agenttune task reader, run Trinity's `check_and_update()`, and hand
   over to Trinity's stage runner (`trinity.cli.launcher.run_stage`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agenttune.plugin_api import Components, Run, UserError, get_logger, resolve_model_path
from agenttune_trinity.taskset import write_taskset
from agenttune_trinity.tinker_mode import tinker_server
from agenttune_trinity.translation import TrinityPaths, total_gpus, trinity_config, validates

log = get_logger("trinity")

INSTALL_HINT = "pip install 'agenttune-plugin-trinity[trinity]' (trinity-rft 0.6.0 with vLLM) on the GPU nodes"


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster the run will use: a running one (`address`), or one this process starts."""

    address: str | None
    gpus: float
    where: str  # for messages


LOCAL_TINKER_CLUSTER = Cluster(None, 0.0, "a Ray cluster of the run's own on this machine (Tinker mode)")


def launch(run: Run, components: Components) -> Any:
    """Run Trinity-RFT on `run`; returns Trinity's stage status."""
    config = run.config
    paths = TrinityPaths.for_run(run.run_dir, resolve_model_path(config.model.path))
    with tinker_server(config, paths.model, run.run_dir) as tinker:
        native = trinity_config(config, paths)
        if tinker is not None:
            native["model"]["tinker"]["base_url"] = tinker.base_url
        trinity_cfg = load_trinity_config(write_trinity_config(native, run.run_dir))
        # A server on this machine's loopback is reachable from this machine only: a Ray cluster of its own
        cluster = LOCAL_TINKER_CLUSTER if tinker and tinker.local else find_cluster(trinity_cfg.cluster.ray_address)
        if tinker is None:
            require_gpus(cluster, needed=total_gpus(config))
            if 0 < total_gpus(config) < cluster.gpus:
                log.warning("the cluster has more GPUs than the config uses", cluster_gpus=cluster.gpus,
                            used=total_gpus(config), hint="set trainer.n_gpus_per_node and trainer.nnodes to use them")
            require_vllm()
        write_tasksets(components, config, Path(paths.tasks))
        if cluster.address is None:
            fill_local_cluster(trinity_cfg, cluster)
        check_and_update(trinity_cfg)
        return run_stage(trinity_cfg, cluster, env=tinker.env() if tinker else {})


def write_trinity_config(native: dict[str, Any], run_dir: Path) -> Path:
    path = run_dir / "trinity" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(native, sort_keys=False), encoding="utf-8")
    return path


def load_trinity_config(path: Path) -> Any:
    """Trinity's `Config` from `path`, through Trinity's own loader (OmegaConf against its schema)."""
    from trinity.common.config import load_config

    try:
        return load_config(str(path))
    except ValueError as error:
        raise UserError(f"Trinity-RFT rejected the generated config {str(path)!r}: {_first_line(error)}",
                        hint="Check the keys under `trinity:` in your config against Trinity-RFT 0.6.0's "
                             "config (trinity.common.config.Config).") from error


def check_and_update(trinity_cfg: Any) -> None:
    """Trinity's own validation, which also fills in what it derives (GPU split, buffer paths, ...)."""
    try:
        trinity_cfg.check_and_update()
    except (ValueError, AssertionError) as error:
        raise UserError(f"Trinity-RFT rejected the config: {_first_line(error)}",
                        hint="See <run_dir>/trinity/config.yaml; adjust the agenttune settings it came from, or "
                             "override Trinity keys under `trinity:`.") from error


def find_cluster(address: str) -> Cluster:
    """Join the Ray cluster at `address` long enough to count its GPUs; None when there is none."""
    import ray

    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except ConnectionError:
        return _local_cluster()
    try:
        gcs = ray.get_runtime_context().gcs_address
        return Cluster(gcs, ray.cluster_resources().get("GPU", 0.0), f"the Ray cluster at {gcs}")
    finally:
        ray.shutdown()


def _local_cluster() -> Cluster:
    import torch

    return Cluster(None, float(torch.cuda.device_count()), "this machine (no Ray cluster is running)")


def require_gpus(cluster: Cluster, *, needed: int) -> None:
    if cluster.gpus >= max(needed, 1):
        return
    if cluster.gpus > 0:
        raise UserError(f"The config asks for {needed} GPUs (trainer.n_gpus_per_node × trainer.nnodes), and "
                        f"{cluster.where} has {cluster.gpus:g}.",
                        hint="Set trainer.n_gpus_per_node and trainer.nnodes to what the cluster has.")
    raise UserError(f"The trinity backbone needs GPUs, and {cluster.where} has none: Trinity-RFT generates with "
                    "vLLM and trains with verl's FSDP workers, both on CUDA devices.",
                    hint="Run on a GPU machine, or join a GPU cluster (`ray start --head` on a GPU node, "
                         "`ray start --address=HEAD:6379` on the others, then `agenttune train` on the head). "
                         "To try the run on this machine first, add trinity.model.tinker.enable=true (Trinity's "
                         "own loop in its Tinker mode, on CPU, against an `agenttune tinker serve` the backbone "
                         "starts); --backbone local trains on CPU without Trinity.")


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise UserError("The trinity backbone needs vLLM for Trinity-RFT's rollout engines, and it is not "
                        "installed.", hint=f"Install it: {INSTALL_HINT}.")


def write_tasksets(components: Components, config: Any, tasks_dir: Path) -> None:
    count = write_taskset(components, config.task_reader.train_split, tasks_dir / "train.jsonl")
    log.info("trinity taskset written", split=config.task_reader.train_split, tasks=count)
    if validates(config):
        # data.val_batch_size: validate on the first N tasks of the split, as the local backbone does
        count = write_taskset(components, config.task_reader.validation_split, tasks_dir / "validation.jsonl",
                              limit=config.data.val_batch_size)
        log.info("trinity taskset written", split=config.task_reader.validation_split, tasks=count)


def fill_local_cluster(trinity_cfg: Any, cluster: Cluster) -> None:
    """Tell Trinity the shape of the cluster this process will start (it would ask a running one)."""
    if not trinity_cfg.cluster.node_num or not trinity_cfg.cluster.gpu_per_node:
        trinity_cfg.cluster.node_num = 1
        trinity_cfg.cluster.gpu_per_node = int(cluster.gpus)
        if cluster.gpus == 1 and trinity_cfg.mode == "both":
            trinity_cfg.mode = "colocate"  # what Trinity picks itself for a one-GPU cluster


def run_stage(trinity_cfg: Any, cluster: Cluster, *, env: dict[str, str]) -> Any:
    """Trinity's stage runner; a cluster started here lives until the stage ends. `env` goes to every
    actor (Tinker mode's server and key)."""
    import ray
    from trinity.cli.launcher import run_stage as trinity_run_stage

    if cluster.address is None:
        # run_stage's own ray.init then joins this one (ignore_reinit_error) and shuts it down at the end.
        # "local": a new cluster, never one that `ray start` (or another run) left on this machine
        ray.init(address="local", namespace=trinity_cfg.ray_namespace, runtime_env={"env_vars": {**trinity_cfg.get_envs(), **env}},
                 include_dashboard=False)
    else:
        trinity_cfg.cluster.ray_address = cluster.address
    status = trinity_run_stage(trinity_cfg)
    if not status.success:
        error = status.error
        raise RuntimeError(f"Trinity-RFT's {status.stage} stage failed: "
                           f"{error.type_name if error else '?'}: {error.message if error else ''} "
                           f"(Trinity's logs: {trinity_cfg.log.save_dir})")
    return status


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:500]
