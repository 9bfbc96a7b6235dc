"""Real AWorld agents, real MCP tool servers, a real gateway over the tiny tokenizer; scripted model replies.

`rig(replies)`       a gateway whose scripted engine answers with `replies`, one episode open on it;
                     `rig.tuner` is that episode's ModelTuner, as a workflow gets it
`mcp_http(kind)`     the example's MCP server as a real process over streamable HTTP or SSE
`ToolUsingEngine`    a scripted engine that acts like a tool-using model, task by task (see its doc)

AWorld writes log files when imported: they go to a temporary directory, never into the checkout.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# Before anything imports aworld (it opens its log files at import).
os.environ.setdefault("AWORLD_LOG_PATH", tempfile.mkdtemp(prefix="aworld-test-logs-"))
os.environ.setdefault("AWORLD_DISABLE_CONSOLE_LOG", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402

from agenttune.plugin_api import (  # noqa: E402
    FrameworkLoader,
    Generation,
    ModelTuner,
    SamplingParams,
    ScriptedEngine,
    Task,
    build_config,
    scripted_logprob,
)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "gaia_aworld"
SERVER = EXAMPLE / "gaia_tools_server.py"
sys.path.insert(0, str(EXAMPLE))  # gaia_agent, gaia_reward: the example's modules


def tool_call(name: str, **arguments: Any) -> str:
    """What a Qwen/Hermes-style model writes to call a tool (the tiny template's format)."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def stdio_mcp_config() -> dict[str, Any]:
    return {"mcpServers": {"gaia-tools": {"command": sys.executable, "args": [str(SERVER)]}}}


def make_config(**sections: Any) -> Any:
    data = {
        "model": {"path": "tiny://default", "max_model_len": 4096},
        "agent_framework": "aworld",
        "engine": {"type": "scripted"},
        "rollout": {"max_response_length_in_one_turn": 256},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config(data, {})


@dataclass
class Rig:
    engine: ScriptedEngine
    gateway: Any
    channel: Any
    tuner: ModelTuner
    tokenizer: Any
    generated: list[list[int]] = field(default_factory=list)


@pytest.fixture
async def rig(tiny_tokenizer: Any, tmp_path: Path) -> AsyncIterator[Any]:
    from agenttune.plugin_api import Gateway

    started: list[Rig] = []

    async def make(replies: list[str], **config_sections: Any) -> Rig:
        config = make_config(**config_sections)
        script = [tiny_tokenizer.encode(reply, add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
                  for reply in replies]
        rig_: Rig

        def respond(prompt_ids: list[int], sampling: SamplingParams) -> Generation:
            index = len(rig_.generated)
            if index >= len(script):
                raise RuntimeError(f"the script has {len(script)} replies; call {index + 1} was made")
            rig_.generated.append(script[index])
            return Generation(script[index], [scripted_logprob(token) for token in script[index]], "stop")

        engine = ScriptedEngine(tokenizer=tiny_tokenizer, responder=respond)
        gateway = Gateway(engine, tiny_tokenizer, config)
        await gateway.start()
        channel = gateway.open_episode(f"episode-{len(started)}", SamplingParams(max_tokens=256))
        frameworks = FrameworkLoader(tmp_path)
        frameworks.get("aworld")  # as rollout_session does: AWorld's logs go to tmp_path/aworld_logs
        tuner = ModelTuner(channel, Task(task_id="t-1", query="question"), config, frameworks)
        rig_ = Rig(engine, gateway, channel, tuner, tiny_tokenizer)
        started.append(rig_)
        return rig_

    yield make
    for each in started:
        await each.tuner.aclose()
        each.gateway.close_episode(each.channel)
        await each.gateway.stop()


def assert_exact_sample(rig: Rig, sample: Any, calls: int) -> None:
    """The sample is the engine's last prompt plus its last generation, and trains only on generations."""
    assert sample.num_calls == calls and len(rig.engine.prompts) == calls
    full = sample.prompt_ids + sample.response_ids
    assert full == rig.engine.prompts[-1] + rig.generated[-1]
    assert sample.prompt_ids == rig.engine.prompts[0]
    expected_mask = [0] * len(full)
    for prompt, generated in zip(rig.engine.prompts, rig.generated, strict=True):
        assert full[: len(prompt)] == prompt
        assert full[len(prompt): len(prompt) + len(generated)] == generated
        expected_mask[len(prompt): len(prompt) + len(generated)] = [1] * len(generated)
    assert sample.loss_mask == expected_mask[len(sample.prompt_ids):]
    generated_logprobs = [scripted_logprob(token) for ids in rig.generated for token in ids]
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m] == generated_logprobs


@pytest.fixture
def mcp_http() -> Iterator[Any]:
    """Start the example's MCP server over HTTP (`streamable-http` or `sse`); returns its URL."""
    processes: list[subprocess.Popen] = []

    def start(transport: str) -> str:
        process = subprocess.Popen([sys.executable, str(SERVER), "--transport", transport],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        processes.append(process)
        line = process.stdout.readline()  # "serving URL" once it accepts connections
        if not line.startswith("serving "):
            process.kill()
            raise RuntimeError(f"the MCP server did not start: {line!r} {process.stderr.read()[-2000:]}")
        return line.split()[1]

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=10)


class ToolUsingEngine(ScriptedEngine):
    """Acts like a model that uses tools, decided by the task's text (`engine.type: tool_using`).

    The question's `calc: EXPR` makes it call `calculate(EXPR)`; once a tool response is in the prompt
    it answers `<answer>RESULT</answer>`. `HANG` in the question makes it never answer; `FAIL` makes
    the engine fail. Every generation is kept in `generations` (class-wide: one engine per run).
    """

    name: ClassVar[str] = "tool_using"
    generations: ClassVar[list[list[int]]] = []

    @classmethod
    def from_config(cls, config: Any, options: Any, tokenizer: Any, *, model: Any = None) -> ToolUsingEngine:
        return cls(tokenizer=tokenizer)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        text = self.tokenizer.decode(prompt_ids)
        last_turn = text.rsplit("<|im_start|>", 2)[-2]  # the last turn before the assistant's
        if "HANG" in last_turn:
            await asyncio.sleep(3600)
        if "FAIL" in last_turn:
            raise RuntimeError("the engine failed (scripted)")
        results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", last_turn, re.DOTALL)
        calc = re.search(r"calc: ([^\n?]+)", last_turn)
        if results:
            reply = f"<answer>{results[-1]}</answer>"
        elif calc:
            reply = tool_call("calculate", expression=calc.group(1).strip())
        else:
            reply = "<answer>no idea</answer>"
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        ToolUsingEngine.generations.append(ids)
        return Generation(ids, [scripted_logprob(token) for token in ids], "stop")
