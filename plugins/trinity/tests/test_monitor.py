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
