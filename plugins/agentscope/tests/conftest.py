"""A real gateway over the tiny model's tokenizer, driven by the scripted engine, for AgentScope agents.

`rig(replies)` starts a gateway whose engine answers with `replies` (text, or token ids) and opens
one episode on it (`agenttune.testing.scripted_episode`); `rig.tuner` is that episode's ModelTuner,
exactly as a workflow receives it. `rig.generated` lists the token ids the engine sampled, call by
call: the truth samples must hold (`assert_exact_sample`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agenttune_agentscope.version import agentscope_line

from agenttune.plugin_api import FrameworkLoader, build_config
from agenttune.testing.scripted_episode import ScriptedEpisode, open_scripted_episode

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


@pytest.fixture
async def rig(tiny_tokenizer: Any, tmp_path: Any) -> AsyncIterator[Any]:
    started: list[ScriptedEpisode] = []

    async def make(replies: list[str | list[int]], *, cycle: bool = False, **config_sections: Any) -> ScriptedEpisode:
        episode = await open_scripted_episode(make_config(**config_sections), tiny_tokenizer, replies,
                                              frameworks=frameworks(tmp_path), cycle=cycle,
                                              episode_id=f"episode-{len(started)}")
        started.append(episode)
        return episode

    yield make
    for episode in started:
        await episode.aclose()


def tool_call(name: str, arguments: str) -> str:
    """What a Qwen/Hermes-style model writes to call a tool (the tiny template's format)."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
