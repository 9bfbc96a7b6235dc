"""The `aworld` agent framework: `tuner.as_aworld_config()` and AWorld's logs in the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agenttune.plugin_api import AgentFramework

if TYPE_CHECKING:
    from agenttune.plugin_api import ModelTuner

LOG_FOLDER = "aworld_logs"


class AWorldFramework(AgentFramework):
    """Hands AWorld agents the model under training.

    `model_for(tuner, agent=None, **kwargs)` returns an `aworld.config.AgentConfig` whose LLM is the
    episode's gateway endpoint (the `openai` provider, base URL, episode key); `agent` names the
    timeline the calls are recorded on, `kwargs` are other AgentConfig fields; workflows call it as
    `tuner.as_aworld_config(...)` (this class's `tuner_methods`). To point an Agent you
    already built, use `agenttune_aworld.point_agent_at(agent, tuner)`.

    `setup(run_dir)` sends AWorld's log files to `<run_dir>/aworld_logs/` (see agenttune_aworld.logs).
    """

    name: ClassVar[str] = "aworld"
    tuner_methods: ClassVar[tuple[str, ...]] = ("as_aworld_config",)

    def setup(self, run_dir: Path) -> None:
        from agenttune_aworld.logs import redirect_logs

        redirect_logs(Path(run_dir) / LOG_FOLDER)

    def model_for(self, tuner: ModelTuner, *, agent: str | None = None, **kwargs: Any) -> Any:
        from agenttune_aworld.agents import llm_config

        return llm_config(tuner, agent, **kwargs)
