"""A verifiers 0.1-0.3 Rubric scoring one episode inside agenttune's judge (under its limits).

The rubric runs on the episode's state as `score_group([state])`, the call verifiers itself makes for a
group: individual reward functions see the episode as in verifiers; group-level ones (plural
parameters: `completions`, `states`, ...) see a group of one, because an agenttune judge scores one
episode at a time (docs/verifiers.md, "Group-level reward functions").
"""

from __future__ import annotations

from typing import Any

from agenttune_verifiers.legacy.loading import load_legacy_env


async def score_legacy(env_spec: dict[str, Any], state_data: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """The weighted reward and `reward/<name>` / `metric/<name>` details (weight 0 makes a metric)."""
    from verifiers.legacy.types import State

    env = load_legacy_env(env_spec)
    state = State(state_data)
    state["reward"], state["metrics"] = None, None
    await env.rubric.score_group([state])
    await env.rubric.cleanup(state)
    weights = _weights(env.rubric)
    details = {f"{'reward' if weights.get(name, 0.0) else 'metric'}/{name}": float(value)
               for name, value in (state["metrics"] or {}).items()}
    return float(state["reward"] or 0.0), details


def _weights(rubric: Any) -> dict[str, float]:
    """Each reward function's weight by name, through RubricGroups (a function in several rubrics: summed)."""
    weights: dict[str, float] = {}
    for part in getattr(rubric, "rubrics", None) or [rubric]:
        for func, weight in zip(part.funcs, part.weights, strict=True):
            name = getattr(func, "__name__", repr(func))
            weights[name] = weights.get(name, 0.0) + weight
    return weights
