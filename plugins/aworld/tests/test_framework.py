"""The plugin as agenttune sees it: `agenttune plugins list`, the `aworld` framework's AgentConfig,
pointing existing agents at the gateway, and AWorld's log files moved into the run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agenttune_aworld.agents import episode_agent, point_agent_at
from aworld.agents.llm_agent import Agent
from aworld.config import AgentConfig

from agenttune.plugin_api import FrameworkLoader, UserError


def cli(*args: str, **env: str) -> str:
    agenttune = Path(sys.executable).with_name("agenttune")
    return subprocess.run([str(agenttune), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout


def test_plugins_list_shows_aworld_without_importing_it():
    [plugin] = [p for p in json.loads(cli("plugins", "list", "--json")) if p["name"] == "aworld"]
    assert plugin["agent_frameworks"] == ["aworld"] and plugin["judges"] == ["reward_function"]
    assert plugin["config_sections"] == ["aworld"] and plugin["error"] is None
    code = ("import sys; from agenttune.plugin_api import get_plugin_manager; get_plugin_manager().infos(); "
            "print([m for m in ('aworld', 'mcp', 'torch') if m in sys.modules])")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_the_plugin_adds_as_aworld_config_to_the_tuner():
    assert FrameworkLoader().provider_of("as_aworld_config") == "aworld"  # the core names no plugin


async def test_as_aworld_config_points_at_the_episode(rig):
    rig_ = await rig([])
    conf = rig_.tuner.as_aworld_config(max_steps=3, llm_temperature=0.2)
    assert isinstance(conf, AgentConfig) and conf.max_steps == 3
    llm = conf.llm_config
    assert (llm.llm_provider, llm.llm_base_url, llm.llm_api_key, llm.max_retries, llm.llm_temperature) == (
        "openai", rig_.tuner.base_url, rig_.tuner.api_key, 0, 0.2)
    assert rig_.tuner.as_aworld_config(agent="critic").llm_config.llm_api_key == f"{rig_.tuner.api_key}.critic"
    with pytest.raises(UserError, match="got llm_api_key, llm_base_url"):
        rig_.tuner.as_aworld_config(llm_base_url="http://elsewhere/v1", llm_api_key="sk-x")


async def test_point_agent_at_rewires_an_agent_in_place(rig):
    rig_ = await rig([])
    agent = Agent(name="solo", conf=AgentConfig(llm_provider="openai", llm_model_name="gpt-4o", llm_api_key="sk-1",
                                                llm_base_url="https://api.example/v1"))
    assert agent.llm is not None  # a client made for the old endpoint ...
    assert point_agent_at(agent, rig_.tuner) is agent
    assert agent.llm.provider.base_url == rig_.tuner.base_url  # ... is made again for the gateway
    assert (agent.conf.llm_config.llm_api_key, agent.llm_max_attempts) == (rig_.tuner.api_key, 1)


async def test_a_factory_must_return_an_agent(rig):
    rig_ = await rig([])
    with pytest.raises(TypeError, match="returned dict, not an AWorld Agent"):
        episode_agent(lambda: {}, rig_.tuner)
    with pytest.raises(UserError, match="aworld.agent names a int"):
        episode_agent(3, rig_.tuner)


REDIRECT = textwrap.dedent("""
    import sys
    from pathlib import Path
    {before}
    from agenttune_aworld.logs import redirect_logs
    redirect_logs(Path("run") / "aworld_logs")
    from aworld.logs.util import logger, llm_logger
    logger.info("after the redirect")
    llm_logger._logger.bind(trace_id="t", direction="OUT", model_name="m", meta="").info("an llm record")
    print("done", flush=True)
""")


@pytest.mark.parametrize("imported_before", [True, False])
def test_aworld_logs_move_into_the_run_directory(tmp_path, imported_before):
    before = 'from aworld.logs.util import logger\nlogger.info("before the redirect")' if imported_before else ""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWORLD_")}
    result = subprocess.run([sys.executable, "-c", REDIRECT.format(before=before)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-2000:]
    new = tmp_path / "run" / "aworld_logs"
    assert "after the redirect" in (new / "aworld.log").read_text()
    assert "an llm record" in (new / "llm.log").read_text()
    assert "after the redirect" not in result.stderr  # AWorld's console output is off during training
    if imported_before:  # what AWorld wrote before the run stays; the files it never wrote to are gone
        assert [path.name for path in (tmp_path / "logs").iterdir()] == ["aworld.log"]
        assert "before the redirect" in (tmp_path / "logs" / "aworld.log").read_text()
        assert "after the redirect" not in (tmp_path / "logs" / "aworld.log").read_text()
    else:
        assert not (tmp_path / "logs").exists()


async def test_failed_request_dumps_land_in_the_run_directory(tmp_path, monkeypatch):
    from agenttune_aworld.framework import LOG_FOLDER, AWorldFramework
    from aworld.agents.llm_agent import LLMAgent

    original = LLMAgent._save_failed_request_context
    monkeypatch.setattr(LLMAgent, "_save_failed_request_context", original)  # restored after the test
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    AWorldFramework().setup(tmp_path / "run")
    agent = Agent(name="dumper", conf=AgentConfig(llm_provider="openai", llm_model_name="m",
                                                  llm_base_url="http://127.0.0.1:9/v1", llm_api_key="k"))
    await agent._save_failed_request_context(messages=[{"role": "user", "content": "hi"}], tools=[],
                                             error="boom", attempt=1, context=None)
    [dump] = (tmp_path / "run" / LOG_FOLDER / "failed_requests").iterdir()
    assert json.loads(dump.read_text())["error"] == "boom"
    assert not (tmp_path / "cwd" / "failed_requests").exists()
