"""Step metrics: what one batch of episodes says about the policy, and the file they go to.

`step_metrics(episodes)` aggregates the episodes of one step into flat `name: number` pairs, the
same names for every backbone, so curves from `debug`, `local`, `verl` and `trinity` runs compare.
`MetricsLog` appends one JSON object per step (with `step`) to `<run_dir>/metrics.jsonl`.

Per-episode counters come from the gateway (`Episode.metrics`, see docs/gateway.md): `calls`,
`prompt_tokens`, `generated_tokens`, `context_overflow`, `merge_breaks`, `merge_break/<reason>`, ...
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agenttune.workflow.episode import Episode, EpisodeStatus

MERGE_BREAK_PREFIX = "merge_break/"  # the gateway's per-reason counters


def step_metrics(episodes: Sequence[Episode], *, prefix: str = "") -> dict[str, float]:
    """Aggregate one step's episodes. `prefix` (e.g. "val/") namespaces every name."""
    if not episodes:
        return {f"{prefix}episodes": 0.0}
    rewards = [episode.reward for episode in episodes]
    turns = [episode.metrics.get("calls", 0.0) for episode in episodes]
    metrics: dict[str, float] = {
        "episodes": float(len(episodes)),
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/min": min(rewards),
        "reward/max": max(rewards),
        "success_rate": _rate(episode.success for episode in episodes),
        "turns/mean": statistics.fmean(turns),
        "turns/max": max(turns),
        "overflow_rate": _rate(episode.metrics.get("context_overflow", 0) > 0 for episode in episodes),
        "turn_limit_rate": _rate(episode.metrics.get("turn_limit", 0) > 0 for episode in episodes),
        "madness_rate": _rate(episode.status is EpisodeStatus.MADNESS for episode in episodes),
        "failure_rate": _rate(episode.status.failed for episode in episodes),
        "not_trainable_rate": _rate(episode.status is EpisodeStatus.NOT_TRAINABLE for episode in episodes),
        "samples/per_episode": statistics.fmean(len(episode.samples) for episode in episodes),
        "duration/episode_mean_s": statistics.fmean(episode.duration_s for episode in episodes),
        "groups/zero_variance_frac": zero_variance_fraction(episodes),
        **_token_metrics(episodes),
        **_failures_by_cause(episodes),
        **_request_errors(episodes),
        **_merge_breaks(episodes),
        **_judge_details(episodes),
        **_unknown_agents(episodes),
    }
    return {f"{prefix}{name}": value for name, value in metrics.items()}


def zero_variance_fraction(episodes: Iterable[Episode]) -> float:
    """The fraction of groups whose episodes all got the same reward (GRPO learns nothing from them)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for episode in episodes:
        groups[episode.group_id].append(episode.reward)
    if not groups:
        return 0.0
    flat = sum(1 for rewards in groups.values() if max(rewards) - min(rewards) <= 1e-9)
    return flat / len(groups)


def _rate(flags: Iterable[bool]) -> float:
    values = [bool(flag) for flag in flags]
    return sum(values) / len(values) if values else 0.0


def _token_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    prompt = [episode.metrics.get("prompt_tokens", 0.0) for episode in episodes]
    generated = [episode.metrics.get("generated_tokens", 0.0) for episode in episodes]
    trained = [sum(sample.num_trained_tokens for sample in episode.trainable_samples) for episode in episodes]
    return {
        "tokens/prompt_total": float(sum(prompt)),
        "tokens/generated_total": float(sum(generated)),
        "tokens/generated_mean": statistics.fmean(generated),
        "tokens/trained_total": float(sum(trained)),
    }


def _failures_by_cause(episodes: Sequence[Episode]) -> dict[str, float]:
    counts = Counter(episode.status for episode in episodes if episode.status.failed)
    # Every cause is always present (0 when none), so curves do not start mid-run.
    return {f"failures/{status.value}": float(counts[status]) for status in EpisodeStatus if status.failed}


def _request_errors(episodes: Sequence[Episode]) -> dict[str, float]:
    """Failed requests inside episodes, also those the agent recovered from (a retried engine error):
    `errors/engine` (the inference engine failed a call), `errors/tool_call` (unreadable or unknown tool calls)."""
    return {f"errors/{name}": float(sum(episode.metrics.get(f"{name}_errors", 0.0) for episode in episodes))
            for name in ("engine", "tool_call")}


def _judge_details(episodes: Sequence[Episode]) -> dict[str, float]:
    """`judge/<key>`: the mean of each numeric judge detail (format_ok, env_score, llm_score, ...)
    over the episodes that report it."""
    values: dict[str, list[float]] = defaultdict(list)
    for episode in episodes:
        for key, value in episode.judge_details.items():
            if isinstance(value, int | float) and math.isfinite(value):  # bools count as 0/1
                values[key].append(float(value))
    return {f"judge/{key}": statistics.fmean(numbers) for key, numbers in sorted(values.items())}


def _unknown_agents(episodes: Sequence[Episode]) -> dict[str, float]:
    """`unknown_agent_calls`: calls of agents `policies.agents` does not name (gateway/policy_routing.py);
    absent when there were none (always, with one policy)."""
    calls = sum(episode.metrics.get("unknown_agent", 0.0) for episode in episodes)
    return {"unknown_agent_calls": float(calls)} if calls else {}


def _merge_breaks(episodes: Sequence[Episode]) -> dict[str, float]:
    """Why timelines did not merge into one sample, summed over the step (`merge_breaks/<reason>`)."""
    totals: defaultdict[str, float] = defaultdict(float)
    for episode in episodes:
        for name, value in episode.metrics.items():
            if name.startswith(MERGE_BREAK_PREFIX):
                totals[name.removeprefix(MERGE_BREAK_PREFIX)] += value
    return {"merge_breaks/total": float(sum(totals.values())),
            **{f"merge_breaks/{reason}": float(count) for reason, count in totals.items()}}


class MetricsLog:
    """`<run_dir>/metrics.jsonl`: one JSON object per step, `{"step": N, "time": ..., name: value, ...}`.

    Merge a step's train and validation metrics into one `write` call. Non-finite values are written
    as null (JSON has no NaN), so every line stays parseable by any JSON reader.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        record = {"step": step, "time": time.time(), **{name: _json_number(v) for name, v in metrics.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
        return record

    def read(self) -> list[dict[str, Any]]:
        """Every step written so far, in order (an empty list before the first step)."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
