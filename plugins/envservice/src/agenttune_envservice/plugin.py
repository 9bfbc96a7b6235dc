"""The plugin's hooks. Imports stay inside the hooks so that `agenttune --help` stays fast."""

from __future__ import annotations

from typing import Any

from agenttune.plugin_api import hookimpl


@hookimpl
def register_task_readers():
    from agenttune_envservice.reader import EnvServiceTaskReader

    return [EnvServiceTaskReader]


@hookimpl
def register_judges():
    from agenttune_envservice.judge import EnvServiceJudge

    return [EnvServiceJudge]


@hookimpl
def register_config_sections():
    from agenttune_envservice.launcher import EnvServiceSection

    return {"env_service": EnvServiceSection}


@hookimpl
def run_services(config: Any, run: Any):
    """Start the EnvService server when `env_service.command` is set; export its URL for the run."""
    from agenttune_envservice.launcher import EnvServiceSection, env_service_for_run

    section = config.section("env_service", EnvServiceSection)
    if not section.command and section == EnvServiceSection():
        return None  # nothing configured: this run does not use the section
    return env_service_for_run(section, run.run_dir)
