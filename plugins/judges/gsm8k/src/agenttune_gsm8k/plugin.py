"""The plugin's hooks. Imports stay inside the hooks so that `agenttune --help` stays fast."""

from __future__ import annotations

from agenttune.plugin_api import hookimpl


@hookimpl
def register_judges():
    from agenttune_gsm8k.judges import GSM8KJudge, MathAndLLMJudge, MathJudge

    return [MathJudge, GSM8KJudge, MathAndLLMJudge]
