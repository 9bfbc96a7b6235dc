"""The engine that generates through verl's `server_manager`."""

from __future__ import annotations

import pytest
from agenttune_verl.engine import VerlEngine
from verl.workers.rollout.replica import TokenOutput

from agenttune.plugin_api import SamplingParams


class OneReply:
    def __init__(self, output: TokenOutput):
        self.output = output
        self.requests: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests.append({"request_id": request_id, "prompt_ids": prompt_ids, "sampling": sampling_params})
        return self.output


@pytest.mark.parametrize(("stop_reason", "finish"), [
    ("completed", "stop"), (None, "stop"), ("length", "length"), ("aborted", "abort"), ("abort", "abort"),
])
async def test_stop_reasons(stop_reason, finish):
    engine = VerlEngine(OneReply(TokenOutput(token_ids=[5, 6], log_probs=[-0.1, -0.2], stop_reason=stop_reason)))
    generation = await engine.generate([1, 2, 3], SamplingParams(), request_id="ep")
    assert (generation.token_ids, generation.logprobs, generation.finish_reason) == ([5, 6], [-0.1, -0.2], finish)


async def test_sampling_and_request_id_reach_verl():
    server = OneReply(TokenOutput(token_ids=[7], log_probs=[-1.0], stop_reason="completed"))
    engine = VerlEngine(server)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=33, stop=("</a>",),
                              stop_token_ids=(2,), seed=11)
    await engine.generate([1, 2], sampling, request_id="episode-1")
    await engine.generate([1, 2, 7, 3], sampling, request_id="episode-1")
    assert [r["request_id"] for r in server.requests] == ["episode-1", "episode-1"]
    assert server.requests[0]["sampling"] == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 33,
                                              "repetition_penalty": 1.0, "logprobs": True, "stop": ["</a>"],
                                              "stop_token_ids": [2], "seed": 11}


async def test_misaligned_logprobs_are_passed_on_for_the_gateway_to_refuse():
    """Issue 24: not dropped to None (which trained as 0.0): the gateway's check refuses the call, by cause."""
    from agenttune.plugin_api import logprob_problem

    engine = VerlEngine(OneReply(TokenOutput(token_ids=[5, 6, 7], log_probs=[-0.1], stop_reason="completed")))
    generation = await engine.generate([1], SamplingParams(), request_id="ep")
    assert generation.token_ids == [5, 6, 7] and generation.logprobs == [-0.1]
    assert logprob_problem(generation.token_ids, generation.logprobs)[0] == "logprob_count"


async def test_stats_per_episode():
    output = TokenOutput(token_ids=[5], log_probs=[-0.1], stop_reason="completed", num_preempted=1,
                         extra_fields={"min_global_steps": 4, "max_global_steps": 5})
    engine = VerlEngine(OneReply(output))
    await engine.generate([1], SamplingParams(), request_id="a")
    await engine.generate([1], SamplingParams(), request_id="a")
    stats = engine.stats("a")
    assert (stats.calls, stats.num_preempted, stats.min_global_steps, stats.max_global_steps) == (2, 2, 4, 5)
    assert engine.stats("b").calls == 0
    engine.forget("a")
    assert engine.stats("a").calls == 0
