"""The plugin's hooks. Imports stay inside the hooks so that `agenttune --help` stays fast (verifiers is heavy)."""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_task_readers():
    from agenttune_verifiers.reader import VerifiersTaskReader

    return [VerifiersTaskReader]


@hookimpl
def register_judges():
    from agenttune_verifiers.judge import VerifiersJudge

    return [VerifiersJudge]
