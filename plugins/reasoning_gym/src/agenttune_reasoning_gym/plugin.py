"""The plugin's hooks. Imports stay inside the hooks so that `agenttune --help` stays fast
(reasoning-gym imports every generator, sympy included, when it is imported)."""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_task_readers():
    from agenttune_reasoning_gym.reader import ReasoningGymTaskReader

    return [ReasoningGymTaskReader]


@hookimpl
def register_judges():
    from agenttune_reasoning_gym.judge import ReasoningGymJudge

    return [ReasoningGymJudge]
