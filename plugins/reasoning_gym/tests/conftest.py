"""Shared helpers for the reasoning-gym plugin's tests: the example's paths and reading a run's rollouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "reasoning_gym"


def rollout_records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for file in sorted((run_dir / "rollouts").glob("*.jsonl"))
            for line in file.read_text().splitlines() if line.strip()]
