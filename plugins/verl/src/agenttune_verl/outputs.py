"""A judged episode as verl's `AgentLoopOutput`s.

Each trainable sample of the episode (one when its calls merged into one timeline) becomes one
output: prompt ids, response ids with the loss mask as `response_mask` (1 exactly on generated
tokens), the sampling logprobs, and the episode's reward. A sample longer than verl's limits is
split at call boundaries into several outputs, each with its own full prompt (agenttune's
`fit_to_limits`, as the local backbone does); nothing is cut inside a call, and calls that fit in no
output are dropped and counted in the episode's metrics (`truncation/...`).

A failed episode (its status is a failure: workflow error, timeout, judge or engine error,
cancelled) is dropped from training and counted, the rule the local backbone follows: in a training
row under verl's V1 trainer it answers with no output at all, so none of its tokens is trained and
its reward is in no GRPO group's mean or std (`verl/failed_episode_dropped` on the episode,
`train/failed_episodes_skipped` per step). Where verl needs an answer for every episode — validation
rows, whose failures must count against accuracy, and the legacy trainer, which takes exactly one
output per episode — it answers with the placeholder below instead, never with its own tokens.

An episode with no trainable sample (a failure where it cannot be dropped, or an episode whose
agents are not trained) answers with one placeholder output whose mask is all zero: its reward
then counts in its GRPO group's baseline, and no token is trained.

With `algorithm.overlong_shaping` on, a training row's reward is the judge's minus DAPO's overlong
penalty on the episode's generated tokens (`OverlongShapingOptions.shaping`), the penalty verl's
own DAPO reward manager would subtract (plugins/verl/tests/test_verl_overlong.py), which agenttune's
agent loop bypasses: it hands verl the reward. The penalty is recorded on the episode
(`overlong_penalty`; summed per step as `train/overlong_penalty`, the local backbone's metric).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agenttune.plugin_api import Episode, OverlongShapingOptions, Sample, fit_all, record_fitting
from agenttune_verl.engine import RequestStats

# Per episode in the rollout log; the metrics bridge sums it per step as `train/failed_episodes_skipped`.
FAILED_EPISODE_DROPPED = "verl/failed_episode_dropped"
# Per episode in the rollout log: DAPO's penalty subtracted from the reward verl trained on.
OVERLONG_PENALTY = "overlong_penalty"


@dataclass(frozen=True)
class Limits:
    prompt_length: int  # verl's rollout.prompt_length (data.max_prompt_length)
    response_length: int  # verl's rollout.response_length (data.max_response_length)


@dataclass
class Cut:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]


def fit_outputs(samples: list[Sample], limits: Limits, episode: Episode) -> list[Cut]:
    """The samples as outputs within verl's limits; what had to be split or dropped is counted on the episode."""
    fitted = fit_all(samples, limits.prompt_length, limits.response_length)
    record_fitting(episode, fitted, f"data.max_prompt_length={limits.prompt_length} / "
                                    f"data.max_response_length={limits.response_length}")
    return [Cut(part.prompt_ids, part.response_ids, part.loss_mask, part.logprobs) for part in fitted.parts]


def episode_outputs(
    episode: Episode,
    limits: Limits,
    *,
    stats: RequestStats,
    task_prompt: Callable[[], list[int]],
    pad_token_id: int,
    keep_all_samples: bool,
    step: int,
    can_drop: bool = False,
    overlong: OverlongShapingOptions | None = None,
) -> list[Any]:
    """The episode's `AgentLoopOutput`s, in timeline order; also records truncation metrics on it.

    `keep_all_samples`: False for verl's legacy trainer, which takes one output per run; the
    episode's last sample is then trained and the others are counted as dropped. `step`: the
    training step the row was fed at, the model version when verl reported none. `task_prompt()`
    gives the row's prompt ids, the context of the placeholder output of an episode with no sample.
    `can_drop`: verl accepts no output for this episode (a training row under the V1 trainer); a
    failed episode then gives none (and is counted), otherwise the placeholder. `overlong`: the
    run's DAPO shaping, for training rows (validation reports the judge's reward).
    """
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    if episode.status.failed and can_drop:
        episode.metrics[FAILED_EPISODE_DROPPED] = 1.0
        return []
    trained = [] if episode.status.failed else episode.trainable_samples  # a failure never trains its tokens
    cuts = fit_outputs([sample for sample in trained if sample.response_ids], limits, episode)
    if not keep_all_samples and len(cuts) > 1:  # the legacy trainer: the last part holds the final answer
        episode.metrics["verl/dropped_samples"] = float(len(cuts) - 1)
        cuts = cuts[-1:]
    if not cuts:
        cuts = [_placeholder(task_prompt(), pad_token_id, limits)]

    metrics = AgentLoopMetrics(
        generate_sequences=stats.generate_s,
        # the time the workflow spent outside the model: tools, environments, the agent framework
        tool_calls=max(0.0, episode.metrics.get("workflow_s", 0.0) - stats.generate_s),
        compute_score=episode.metrics.get("judge_s", 0.0),
        num_preempted=stats.num_preempted if stats.calls else -1,
    )
    reward = float(episode.reward) - overlong_penalty(episode, overlong)
    return [
        AgentLoopOutput(
            prompt_ids=cut.prompt_ids,
            response_ids=cut.response_ids,
            response_mask=cut.response_mask,
            response_logprobs=cut.logprobs,
            reward_score=reward,
            num_turns=max(2, len(episode.messages)),
            metrics=metrics,
            extra_fields=_extra_fields(episode, stats, step),
        )
        for cut in cuts
    ]


def overlong_penalty(episode: Episode, overlong: OverlongShapingOptions | None) -> float:
    """DAPO's penalty for the episode's length (0 for a failure, which trains nothing); recorded on it."""
    if overlong is None or not overlong.enable or episode.status.failed:
        return 0.0
    penalty = overlong.shaping(episode.generated_tokens)
    episode.metrics[OVERLONG_PENALTY] = penalty
    return penalty


def _placeholder(prompt_ids: list[int], pad_token_id: int, limits: Limits) -> Cut:
    """One untrained token after the task's prompt: verl needs a non-empty response to hold the reward."""
    prompt = prompt_ids[-limits.prompt_length:] if prompt_ids else [pad_token_id]
    return Cut(prompt, [pad_token_id], [0], [0.0])


def _extra_fields(episode: Episode, stats: RequestStats, step: int) -> dict[str, Any]:
    return {
        # verl logs these per data source in validation (val-aux/...) and its DAPO filter can use "acc"
        "reward_extra_info": {"acc": float(episode.success), "failed": float(episode.status.failed)},
        # the model versions that generated the episode; verl's V1 trainer needs integers here
        "min_global_steps": stats.min_global_steps if stats.min_global_steps is not None else step,
        "max_global_steps": stats.max_global_steps if stats.max_global_steps is not None else step,
        # the keys verl's own agent loops always set, so that batches from mixed loops concatenate
        "turn_scores": [],
        "tool_rewards": [],
        "agenttune_episode_id": episode.episode_id,
        "agenttune_status": episode.status.value,
    }
