"""A real gateway over the tiny model's tokenizer, driven by the scripted engine, for AgentScope agents.

`rig(replies)` starts a gateway whose engine answers with `replies` (text, or token ids) and opens
one episode on it; `rig.tuner` is that episode's ModelTuner, exactly as a workflow receives it.
`rig.generated` lists the token ids the engine sampled, call by call: the truth samples must hold.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from agenttune_agentscope.version import agentscope_line

from agenttune.config_loader import build_config
from agenttune.engine import Generation, SamplingParams
from agenttune.engines.scripted import ScriptedEngine
from agenttune.task import Task
from agenttune.tuner import FrameworkLoader, ModelTuner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LINE = agentscope_line()
only_agentscope1 = pytest.mark.skipif(LINE != 1, reason="AgentScope 1.x API (nox -s agentscope1)")
only_agentscope2 = pytest.mark.skipif(LINE != 2, reason="AgentScope 2.x API (nox -s agentscope2)")


def make_config(**sections: Any) -> Any:
    data = {
        "model": {"path": "tiny://default", "max_model_len": 4096},
        "agent_framework": "agentscope",
        "engine": {"type": "scripted"},
        "rollout": {"max_response_length_in_one_turn": 256},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config(data, {})


def frameworks(run_dir: Any) -> FrameworkLoader:
    """The run's agent frameworks, set up before the first episode as `rollout_session` does it."""
    loader = FrameworkLoader(run_dir)
    loader.get("agentscope")
    return loader


@dataclass
class Rig:
    engine: ScriptedEngine
    gateway: Any
    channel: Any
    tuner: ModelTuner
    tokenizer: Any
    generated: list[list[int]] = field(default_factory=list)

    def prompt_text(self, index: int) -> str:
        return self.tokenizer.decode(self.engine.prompts[index])


@pytest.fixture
async def rig(tiny_tokenizer: Any, tmp_path: Any) -> AsyncIterator[Any]:
    from agenttune.gateway import Gateway

    started: list[Rig] = []

    async def make(replies: list[str | list[int]], *, cycle: bool = False, **config_sections: Any) -> Rig:
        config = make_config(**config_sections)
        script = [_ids(tiny_tokenizer, reply) for reply in replies]
        calls = iter(range(10**9))
        rig_: Rig

        def respond(prompt_ids: list[int], sampling: SamplingParams) -> Generation:
            index = next(calls)
            if index >= len(script) and not cycle:
                raise RuntimeError(f"the script has {len(script)} replies; call {index + 1} was made")
            ids = script[index % len(script)]
            rig_.generated.append(ids)
            return Generation(ids, [-0.01 * (1 + i % 7) for i in range(len(ids))], "stop")

        engine = ScriptedEngine(tokenizer=tiny_tokenizer, responder=respond)
        gateway = Gateway(engine, tiny_tokenizer, config)
        await gateway.start()
        channel = gateway.open_episode(f"episode-{len(started)}", SamplingParams(max_tokens=256))
        tuner = ModelTuner(channel, Task(task_id="t-1", query="What is 2 + 3?"), config, frameworks(tmp_path))
        rig_ = Rig(engine, gateway, channel, tuner, tiny_tokenizer)
        started.append(rig_)
        return rig_

    yield make
    for each in started:
        await each.tuner.aclose()
        each.gateway.close_episode(each.channel)
        await each.gateway.stop()


def _ids(tokenizer: Any, reply: str | list[int]) -> list[int]:
    if isinstance(reply, list):
        return reply
    return tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]


def tool_call(name: str, arguments: str) -> str:
    """What a Qwen/Hermes-style model writes to call a tool (the tiny template's format)."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def assert_exact_sample(rig: Rig, sample: Any, calls: int) -> None:
    """The sample is the engine's last prompt plus its last generation, and trains only on generations.

    Every call's prompt extends the previous prompt and generation (that is what merging means), so
    the last prompt + last generation holds every sampled token; the mask is 1 exactly on those.
    """
    assert sample.num_calls == calls
    assert len(rig.engine.prompts) == calls
    full = sample.prompt_ids + sample.response_ids
    assert full == rig.engine.prompts[-1] + rig.generated[-1]
    assert sample.prompt_ids == rig.engine.prompts[0]
    expected_mask = [0] * len(full)
    for prompt, generated in zip(rig.engine.prompts, rig.generated, strict=True):
        assert full[: len(prompt)] == prompt
        assert full[len(prompt): len(prompt) + len(generated)] == generated
        expected_mask[len(prompt): len(prompt) + len(generated)] = [1] * len(generated)
    assert sample.loss_mask == expected_mask[len(sample.prompt_ids):]
    assert sum(sample.loss_mask) == sum(len(ids) for ids in rig.generated)
