"""Trinity's step metrics land in agenttune's metrics.jsonl, and still reach Trinity's own monitor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from agenttune_trinity.launch import check_and_update, load_trinity_config, write_trinity_config
from agenttune_trinity.translation import TrinityPaths, trinity_config


def test_metrics_go_to_metrics_jsonl_and_to_tensorboard(make_config, tmp_path: Path):
    from trinity.utils.monitor import MONITOR

    config = make_config()
    paths = TrinityPaths.for_run(tmp_path / "run", config.model.path)
    cfg = load_trinity_config(write_trinity_config(trinity_config(config, paths), tmp_path / "run"))
    check_and_update(cfg)

    # what Trinity's explorer and trainer do with config.monitor
    monitor = MONITOR.get(cfg.monitor.monitor_type)(project=cfg.project, group=cfg.group, name=cfg.name,
                                                    role="explorer", config=cfg)
    monitor.log({"rollout/reward/mean/mean": np.float32(0.5), "rollout/turns/mean/mean": torch.tensor(2.0),
                 "rollout/episodes:sum": 8}, step=3)
    monitor.close()

    [line] = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["step"] == 3
    assert record["rollout/reward/mean/mean"] == 0.5 and record["rollout/turns/mean/mean"] == 2.0
    assert record["rollout/episodes:sum"] == 8.0
    events = list((Path(cfg.monitor.cache_dir) / "tensorboard" / "explorer").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_every_enabled_monitor_gets_the_metrics(make_config, tmp_path: Path):
    """Trinity runs one monitor class; agenttune's hands each step to every monitor the config enables, so
    turning on wandb (or swanlab) keeps the default tensorboard instead of silently replacing it."""
    from agenttune_trinity.translation import monitor_inner
    from trinity.utils.monitor import MONITOR, Monitor

    assert monitor_inner(make_config(monitor={"wandb": True})) == ["tensorboard", "wandb"]
    assert monitor_inner(make_config(monitor={"tensorboard": False, "swanlab": True, "wandb": True})) == [
        "wandb", "swanlab"]
    assert monitor_inner(make_config(monitor={"tensorboard": False})) is None

    logged: list[tuple[str, int]] = []

    class Recording(Monitor):  # a monitor as Trinity's registry builds them (group= included)
        def __init__(self, project: str, group: str, name: str, role: str, config: object = None) -> None:
            super().__init__(project=project, name=name, role=role, config=config)

        def log(self, data: dict, step: int, commit: bool = False) -> None:
            logged.append(("log", step))

        def close(self) -> None:
            logged.append(("close", -1))

    MONITOR.register_module("agenttune_test_recording", Recording, force=True)
    config = make_config()
    paths = TrinityPaths.for_run(tmp_path / "run", config.model.path)
    native = trinity_config(config, paths)
    native["monitor"]["monitor_args"]["inner"] = ["tensorboard", "agenttune_test_recording"]
    cfg = load_trinity_config(write_trinity_config(native, tmp_path / "run"))
    check_and_update(cfg)
    monitor = MONITOR.get(cfg.monitor.monitor_type)(project=cfg.project, group=cfg.group, name=cfg.name,
                                                    role="trainer", config=cfg)
    monitor.log({"actor/loss": 0.25}, step=2)
    monitor.close()
    assert logged[:2] == [("log", 2), ("close", -1)]  # (Trinity's Monitor.__del__ may close it once more)
    assert list((Path(cfg.monitor.cache_dir) / "tensorboard" / "trainer").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["actor/loss"] == 0.25
