"""Judged episodes as Trinity `Experience`s.

Each trainable sample of an episode (one when its calls merged into one timeline; more when the
history was rewritten or several agents are trained) becomes one multi-turn Experience: the first
prompt, then everything after it with `action_mask` 1 exactly on generated tokens, the sampling
logprobs aligned with it, and the episode's reward. The Experiences of one episode share its run id
(`eid.run`) and are numbered by `eid.step`, which is how Trinity's multi-step GRPO groups them: the
run's reward is compared within the task's group and its advantage goes to every sample of the run.

A sample longer than `data.max_prompt_length` / `data.max_response_length` is split at call
boundaries (agenttune's `fit_to_limits`, as the local and verl backbones do), each part with its own
full prompt; calls that fit in no part are dropped and counted (`truncation/...` on the episode).

With `algorithm.overlong_shaping` on, a training episode's reward is the judge's minus DAPO's
overlong penalty on its generated tokens (`OverlongShapingOptions.shaping`, the local backbone's rule).
Trinity's own DAPO shaping lives in a math reward function (`math_dapo_reward`) that agenttune's judge
replaces, so it is applied here; it equals that function's `compute_overlong_penalty` (tests).

Failed episodes (crashed, timed out, judge failed) give no Experience: like the local backbone, an
engine crash says nothing about the policy. An episode that ended normally but has no trainable
sample (its agents are not trained, or it never called the model) still gives one Experience with
an all-zero action mask, so its reward counts in its group's baseline and no token is trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agenttune.plugin_api import (
    Episode,
    OverlongShapingOptions,
    Sample,
    fit_all,
    record_fitting,
    step_metrics,
)

OVERLONG_PENALTY = "overlong_penalty"  # the group's summed penalty, in the step metrics Trinity averages


def episode_experiences(episode: Episode, *, run_id: int, pad_token_id: int,
                        limits: tuple[int, int] | None = None,
                        overlong: OverlongShapingOptions | None = None) -> list[Any]:
    """The Trinity Experiences of one episode, in timeline order ([] when it failed).

    `limits`: (max prompt, max response) tokens; longer samples are split at call boundaries.
    `overlong`: DAPO's shaping of the reward (training tasks only).
    """
    if episode.status.failed:
        return []
    samples = [sample for sample in episode.trainable_samples if sample.response_ids]
    if limits is not None:
        fitted = fit_all(samples, *limits)
        record_fitting(episode, fitted, f"data.max_prompt_length={limits[0]} / data.max_response_length={limits[1]}")
        samples = fitted.parts
    if not samples:
        samples = [_placeholder(episode, pad_token_id)]
    reward = episode.reward - (overlong.shaping(episode.generated_tokens) if overlong is not None else 0.0)
    return [_experience(episode, sample, reward, run_id=run_id, step=step) for step, sample in enumerate(samples)]


def group_experiences(episodes: Sequence[Episode], *, run_id_base: int, pad_token_id: int,
                      limits: tuple[int, int] | None = None,
                      overlong: OverlongShapingOptions | None = None) -> list[Any]:
    """The Experiences of one task's group of episodes, with the group's step metrics on the last one.

    Trinity averages the metrics it finds on Experiences over a step's tasks, so the names are
    agenttune's usual step metrics (`reward/mean`, `success_rate`, `failure_rate`, ...).
    """
    experiences = [
        experience
        for episode in episodes
        for experience in episode_experiences(episode, run_id=run_id_base + episode.repeat_index,
                                              pad_token_id=pad_token_id, limits=limits, overlong=overlong)
    ]
    if experiences:
        experiences[-1].metrics = step_metrics(episodes)
        if overlong is not None and overlong.enable:
            experiences[-1].metrics[OVERLONG_PENALTY] = sum(
                overlong.shaping(episode.generated_tokens) for episode in episodes if not episode.status.failed)
    return experiences


def _experience(episode: Episode, sample: Sample, reward: float, *, run_id: int, step: int) -> Any:
    from trinity.common.experience import EID, Experience

    return Experience(
        eid=EID(run=run_id, step=step),
        tokens=[*sample.prompt_ids, *sample.response_ids],
        prompt_length=len(sample.prompt_ids),
        action_mask=[bool(flag) for flag in sample.loss_mask],
        logprobs=list(sample.logprobs),
        reward=float(reward),
        info={
            "agenttune_episode_id": episode.episode_id,
            "agenttune_task_id": episode.task.task_id,
            "agenttune_agent": sample.agent,
            "agenttune_status": episode.status.value,
            "agenttune_success": episode.success,
            "agenttune_num_calls": sample.num_calls,
        },
    )


def _placeholder(episode: Episode, pad_token_id: int) -> Sample:
    """One untrained token after the episode's first prompt: Trinity needs a response to hold the reward."""
    first = episode.samples[0].prompt_ids if episode.samples else []
    return Sample(agent="default", prompt_ids=first or [pad_token_id], response_ids=[pad_token_id],
                  loss_mask=[0], logprobs=[0.0], num_calls=0)
