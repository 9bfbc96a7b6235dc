"""Call boundaries come from the gateway's record of the calls, never from runs of the loss mask
(issue 36 item 4).

Under `tool_choice`, a grammar forces some tokens inside a reply (loss mask 0): the mask has many
runs per call. A corpus of multi-turn guided episodes on the tiny model through the `hf` engine is
fitted to many limits; for every sample of every episode (100 % of the corpus) the calls counted in
the parts plus the calls dropped equal the calls the agent made, and each call is kept whole or
dropped under its own reason. The oracle is what the API told the agent (`usage`): each call's
prompt and reply lengths, never the sample's own spans.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from test_gateway_guided import SEARCH, WEATHER, client_for, serving

from agenttune.workflow.episode import _generated_runs, fit_all, fit_to_limits

pytestmark = pytest.mark.slow  # a corpus of 24 guided calls on the tiny model

EPISODES = 8
TURNS = 3
CHOICES = [{"type": "function", "function": {"name": "get_weather"}}, "required"]


async def guided_episode(gateway, index: int):
    """TURNS guided calls, each answered by a tool result; returns (channel, [(prompt, reply) lengths])."""
    channel = gateway.open_episode(f"e{index}")
    client = client_for(channel)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    lengths = []
    for turn in range(TURNS):
        reply = await client.chat.completions.create(
            model="m", messages=messages, tools=[WEATHER, SEARCH], tool_choice=CHOICES[(index + turn) % 2],
            parallel_tool_calls=False, temperature=1.0)
        message = reply.choices[0].message
        lengths.append((reply.usage.prompt_tokens, reply.usage.completion_tokens))
        messages += [message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny, 21 C"}]
    return channel, lengths


@pytest.fixture(scope="module")
def corpus(tiny_model_path):
    """EPISODES guided episodes: [(samples, calls made, per-call (prompt, reply) lengths)]."""
    from agenttune.testing import load_tiny_model, tiny_tokenizer

    async def run():
        async with serving(load_tiny_model(), tiny_tokenizer(), 256) as gateway:
            episodes = await asyncio.gather(*(guided_episode(gateway, index) for index in range(EPISODES)))
        return [(channel.samples(), int(channel.metrics()["calls"]), lengths) for channel, lengths in episodes]

    return asyncio.run(run())


def usage_spans(lengths):
    """Where each call's reply lies in the merged sample's response, from the API's usage alone: a
    call's prompt is the first prompt plus everything before its reply."""
    first = lengths[0][0]
    return [(prompt - first, prompt - first + reply) for prompt, reply in lengths]


def expected(sample, lengths, max_prompt: int, max_response: int):
    """From the usage alone: the reply lengths kept, in order, and the calls dropped by reason. A part
    starts at a call whose prompt fits and takes the following calls while its response fits."""
    if len(sample.prompt_ids) <= max_prompt and len(sample.response_ids) <= max_response:
        return [reply for _, reply in lengths], {}
    first_prompt = lengths[0][0]
    kept, dropped, spans, index = [], Counter(), usage_spans(lengths), 0
    while index < len(spans):
        start = spans[index][0]
        if first_prompt + start > max_prompt:
            dropped["prompt_too_long"] += len(spans) - index
            break
        if spans[index][1] - start > max_response:
            dropped["call_too_long"] += 1
            index += 1
            continue
        while index < len(spans) and spans[index][1] - start <= max_response:
            kept.append(spans[index][1] - spans[index][0])
            index += 1
    return kept, dict(dropped)


def test_the_corpus_has_forced_tokens_inside_calls(corpus):
    """What makes the other test mean something: the loss mask splits every guided call into pieces."""
    for samples, calls, lengths in corpus:
        [sample] = samples  # each episode's calls merged into one sample
        assert sample.num_calls == calls == TURNS
        assert len(_generated_runs(sample.loss_mask)) > 2 * calls
        assert sample.calls == usage_spans(lengths)  # the gateway's record is what the agent was told


def test_counted_calls_equal_calls_made_under_every_limit(corpus):
    replies = sorted(reply for _, _, lengths in corpus for _, reply in lengths)
    prompts = sorted(prompt for _, _, lengths in corpus for prompt, _ in lengths)
    limits = [(10**6, 10**6), (10**6, replies[0] - 1), (prompts[0], 10**6)]
    limits += [(prompt, reply) for prompt in prompts[::5] for reply in (replies[0], replies[len(replies) // 2],
                                                                        replies[-1], 2 * replies[-1])]
    checked = 0
    for max_prompt, max_response in limits:
        for samples, calls, lengths in corpus:
            [sample] = samples
            fitted = fit_to_limits(sample, max_prompt, max_response)
            kept, dropped = expected(sample, lengths, max_prompt, max_response)
            assert sum(part.num_calls for part in fitted.parts) + fitted.dropped_calls == calls
            assert dict(fitted.dropped) == dropped, (max_prompt, max_response)
            assert [end - start for part in fitted.parts for start, end in part.calls] == kept
            for part in fitted.parts:  # whole calls only, each part within the limits it was fitted to
                assert part.num_calls == len(part.calls) >= 1
                assert part.calls[0][0] == 0 and part.calls[-1][1] == len(part.response_ids)
                if fitted.split:
                    assert len(part.prompt_ids) <= max_prompt and len(part.response_ids) <= max_response
            checked += 1
    assert checked == len(limits) * EPISODES
    # fit_all over the whole corpus adds the reasons up, each dropped call under its own
    everything = [sample for samples, _, _ in corpus for sample in samples]
    fitted = fit_all(everything, prompts[len(prompts) // 2], replies[len(replies) // 2])
    total_kept = sum(part.num_calls for part in fitted.parts)
    assert total_kept + fitted.dropped_calls == EPISODES * TURNS
    assert len(fitted.dropped) == 2  # this middle limit drops calls for both reasons
