"""A judged episode as verl's `AgentLoopOutput`s.

Each trainable sample of the episode (one when its calls merged into one timeline) becomes one
output: prompt ids, response ids with the loss mask as `response_mask` (1 exactly on generated
tokens), the sampling logprobs, and the episode's reward. Lengths are cut to verl's limits the way
verl's own agent loops cut them (prompts keep their end, responses their start), and every cut is
counted in the episode's metrics (`truncation/...`).

An episode with no trainable sample (it failed before its first call, or its agents are not trained)
still answers with one output whose mask is all zero: its reward then counts in its GRPO group's
baseline, and no token is trained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agenttune.plugin_api import Episode, Sample
from agenttune_verl.engine import RequestStats


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
    prompt_tokens_cut: int
    response_tokens_cut: int
    trained_tokens_cut: int


def cut_to_limits(sample: Sample, limits: Limits) -> Cut:
    prompt_cut = max(0, len(sample.prompt_ids) - limits.prompt_length)
    keep = limits.response_length
    return Cut(
        prompt_ids=sample.prompt_ids[prompt_cut:],
        response_ids=sample.response_ids[:keep],
        response_mask=sample.loss_mask[:keep],
        logprobs=sample.logprobs[:keep],
        prompt_tokens_cut=prompt_cut,
        response_tokens_cut=max(0, len(sample.response_ids) - keep),
        trained_tokens_cut=sum(sample.loss_mask[keep:]),
    )


def episode_outputs(
    episode: Episode,
    limits: Limits,
    *,
    stats: RequestStats,
    task_prompt: Callable[[], list[int]],
    pad_token_id: int,
    keep_all_samples: bool,
    step: int,
) -> list[Any]:
    """The episode's `AgentLoopOutput`s, in timeline order; also records truncation metrics on it.

    `keep_all_samples`: False for verl's legacy trainer, which takes one output per run; the
    episode's last sample is then trained and the others are counted as dropped. `step`: the
    training step the row was fed at, the model version when verl reported none. `task_prompt()`
    gives the row's prompt ids, the context of the placeholder output of an episode with no sample.
    """
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    samples = episode.trainable_samples
    if not keep_all_samples and len(samples) > 1:
        episode.metrics["verl/dropped_samples"] = float(len(samples) - 1)
        samples = samples[-1:]
    cuts = [cut_to_limits(sample, limits) for sample in samples if sample.response_ids]
    if not cuts:
        cuts = [_placeholder(task_prompt(), pad_token_id, limits)]
    _record_truncation(episode, cuts)

    metrics = AgentLoopMetrics(
        generate_sequences=stats.generate_s,
        # the time the workflow spent outside the model: tools, environments, the agent framework
        tool_calls=max(0.0, episode.metrics.get("workflow_s", 0.0) - stats.generate_s),
        compute_score=episode.metrics.get("judge_s", 0.0),
        num_preempted=stats.num_preempted if stats.calls else -1,
    )
    return [
        AgentLoopOutput(
            prompt_ids=cut.prompt_ids,
            response_ids=cut.response_ids,
            response_mask=cut.response_mask,
            response_logprobs=cut.logprobs,
            reward_score=float(episode.reward),
            num_turns=max(2, len(episode.messages)),
            metrics=metrics,
            extra_fields=_extra_fields(episode, stats, step),
        )
        for cut in cuts
    ]


def _placeholder(prompt_ids: list[int], pad_token_id: int, limits: Limits) -> Cut:
    """One untrained token after the task's prompt: verl needs a non-empty response to hold the reward."""
    prompt = prompt_ids[-limits.prompt_length:] if prompt_ids else [pad_token_id]
    return Cut(prompt, [pad_token_id], [0], [0.0], 0, 0, 0)


def _record_truncation(episode: Episode, cuts: list[Cut]) -> None:
    episode.metrics["truncation/prompt_tokens"] = float(sum(cut.prompt_tokens_cut for cut in cuts))
    episode.metrics["truncation/response_tokens"] = float(sum(cut.response_tokens_cut for cut in cuts))
    episode.metrics["truncation/trained_tokens"] = float(sum(cut.trained_tokens_cut for cut in cuts))
    episode.metrics["truncation/samples"] = float(
        sum(1 for cut in cuts if cut.prompt_tokens_cut or cut.response_tokens_cut))


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
