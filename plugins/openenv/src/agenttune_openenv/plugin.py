"""The plugin's hooks. Imports stay inside the hooks so that `agenttune --help` stays fast."""

from __future__ import annotations

from typing import Any

from agenttune.plugin_api import hookimpl


@hookimpl
def register_task_readers():
    from agenttune_openenv.reader import OpenEnvTaskReader

    return [OpenEnvTaskReader]


@hookimpl
def register_judges():
    from agenttune_openenv.judge import OpenEnvJudge

    return [OpenEnvJudge]


@hookimpl
def register_config_sections():
    from agenttune_openenv.section import OpenEnvSection

    return {"openenv": OpenEnvSection}


@hookimpl
def run_services(config: Any, run: Any):
    """Start the OpenEnv server (openenv.app / openenv.command) for the run; export its URL."""
    from agenttune_openenv.section import OpenEnvSection
    from agenttune_openenv.server import openenv_server_for_run

    section = config.section("openenv", OpenEnvSection)
    if not section.configured:
        return None  # nothing configured: this run does not use the section
    return openenv_server_for_run(section, run.run_dir, config.source_dir)
