"""The seeds' environment loop with an AgentScope agent, against a real EnvService server.

    for _ in range(max_steps):
        reply = await agent(msg)
        obs, _, terminate, _ = await env.gym_step(action={"content": reply.content, "role": "assistant"})
        ...

The server is agenttune-plugin-envservice's protocol-faithful demo (a number-guessing game) running
as its own process on loopback; the model is the scripted engine, guessing wrong once, then right.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from agenttune_envservice import env_for
from agenttune_envservice.demo_server import secret_of
from conftest import LINE, frameworks, make_config

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.plugin_api import EpisodeStatus, Generation, RolloutEngine, ScriptedEngine, get_component


@pytest.fixture
def env_server(tmp_path) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path / "env-server.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "agenttune_envservice.demo_server", "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError((tmp_path / "env-server.log").read_text()) from None
                time.sleep(0.05)
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)
        log.close()


class SeedLoopWorkflow(Workflow):
    """ASTune's AppWorld loop, with `model=tuner` as the seeds write it."""

    async def execute(self, task: Task, tuner) -> WorkflowOutput:
        env = env_for(task, tuner)
        first = await env.reset()
        system = next(m["content"] for m in first if m["role"] == "system")
        query = next(m["content"] for m in first if m["role"] == "user")
        if LINE == 1:
            from agentscope.agent import ReActAgent
            from agentscope.formatter import DashScopeChatFormatter
            from agentscope.memory import InMemoryMemory
            from agentscope.message import Msg

            agent = ReActAgent(name="Qwen", sys_prompt=system, model=tuner, formatter=DashScopeChatFormatter(),
                               memory=InMemoryMemory(), toolkit=None, print_hint_msg=False)
            agent.set_console_output_enabled(False)
            interaction_message = Msg(name="user", content=query, role="user")
            for _ in range(tuner.config.rollout.max_turns):  # from here on, the seed's loop verbatim
                reply_message = await agent(interaction_message)
                obs, _, terminate, _ = await env.gym_step(action={"content": reply_message.content,
                                                                  "role": "assistant"})
                interaction_message = Msg(name="env", content=obs, role="user")
                if terminate or tuner.context_overflow:
                    break
        else:  # 2.x: Agent has no __call__, and Msg content is a list of blocks
            from agentscope.agent import Agent
            from agentscope.message import UserMsg

            agent = Agent(name="Qwen", system_prompt=system, model=tuner)
            interaction_message = UserMsg(name="user", content=query)
            for _ in range(tuner.config.rollout.max_turns):
                reply_message = await agent.reply(interaction_message)
                obs, _, terminate, _ = await env.gym_step(action={"content": reply_message.get_text_content(),
                                                                  "role": "assistant"})
                interaction_message = UserMsg(name="env", content=obs)
                if terminate or tuner.context_overflow:
                    break
        return WorkflowOutput()


async def test_seed_environment_loop_scores_and_merges_into_one_sample(env_server, tiny_tokenizer, tmp_path):
    from agenttune.plugin_api import Gateway

    config = make_config(rollout={"num_repeat": 1, "max_turns": 5}, task_reader={"type": "env_service"})
    reader_cls = get_component("task_readers", "env_service")
    reader = reader_cls(reader_cls.Options(env_type="guess", url=env_server))
    tasks = list(reader.read("train"))[:2]
    judge_cls = get_component("judges", "env_service")

    def guess(prompt_ids, sampling) -> Generation:
        """Guess 1 first (wrong unless the secret is 1), then the task's secret."""
        text = tiny_tokenizer.decode(prompt_ids)
        task_id = re.search(r"Task (\S+): guess my number", text).group(1)
        turn = text.count("<|im_start|>assistant") - 1
        number = secret_of(task_id) if turn > 0 else 1
        ids = tiny_tokenizer.encode(str(number), add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
        return Generation(ids, [-0.2] * len(ids), "stop")

    gateway = Gateway(ScriptedEngine(tokenizer=tiny_tokenizer, responder=guess), tiny_tokenizer, config)
    await gateway.start()
    try:
        engine = RolloutEngine(config, gateway, SeedLoopWorkflow, judge_cls(judge_cls.Options()),
                               frameworks=frameworks(tmp_path))
        episodes = await engine.run_tasks(tasks)
    finally:
        await gateway.stop()

    for episode in episodes:
        assert episode.status is EpisodeStatus.OK, episode.error
        assert episode.reward == 1.0 and episode.success
        [sample] = episode.samples
        wins_first = secret_of(episode.task.task_id) == 1
        assert sample.agent == "Qwen" and sample.num_calls == (1 if wins_first else 2)
        observation = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m == 0]
        if not wins_first:
            assert "Higher." in tiny_tokenizer.decode(observation)  # the env's answer, masked
    assert httpx.get(f"{env_server}/_stats", timeout=5).json()["live"] == []  # every instance released
