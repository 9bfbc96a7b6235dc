"""The plugin as agenttune sees it: registration, the config section, the model it hands out."""

from __future__ import annotations

import subprocess
import sys

import pytest
from agenttune_agentscope.framework import AgentScopeFramework
from conftest import LINE, make_config

from agenttune.plugin_api import FrameworkLoader, UserError, get_component


def test_listed_without_importing_agentscope():
    script = (
        "import sys\n"
        "from agenttune.plugin_api import cli_main as main\n"
        "try:\n    main(['plugins', 'list'])\nexcept SystemExit:\n    pass\n"
        "assert 'agentscope' not in sys.modules, 'agentscope was imported by plugins list'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "agentscope" in result.stdout
    assert "agenttune-plugin-agentscope" in result.stdout


def test_registered_as_the_agentscope_framework():
    assert get_component("agent_frameworks", "agentscope") is AgentScopeFramework
    # the plugin, not the core, adds tuner.as_agentscope_model
    assert FrameworkLoader().provider_of("as_agentscope_model") == "agentscope"


def test_config_section_has_headless_defaults_and_rejects_bad_values():
    options = make_config().section("agentscope")
    assert (options.headless, options.permission_mode, options.inject_runtime_state) == (True, "bypass", False)

    with pytest.raises(UserError, match="permission_mode"):
        make_config(agentscope={"permission_mode": "always"})


async def test_model_points_at_the_episode_with_a_per_agent_key(rig):
    rig = await rig(["ok"])

    model = rig.tuner.as_agentscope_model(agent="critic")

    assert str(model.client.base_url).rstrip("/") == rig.tuner.base_url.rstrip("/")
    assert model.client.api_key == rig.tuner.api_key_for("critic") == f"{rig.tuner.api_key}.critic"
    assert model.agenttune_agent == "critic"
    assert type(model).__module__ == f"agenttune_agentscope.v{LINE}"


async def test_client_arguments_are_refused_with_a_clear_error(rig):
    rig = await rig(["ok"])

    with pytest.raises(UserError, match="gateway"):
        rig.tuner.as_agentscope_model(client_kwargs={"base_url": "http://elsewhere/v1"})
