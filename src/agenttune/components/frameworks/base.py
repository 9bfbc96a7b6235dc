"""Agent frameworks adapt the model under training to an agent library's own model class."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from agenttune.workflow.tuner import ModelTuner


class AgentFramework:
    """Connects one agent library to the gateway.

    `name` is what `--agent` / `agent_framework:` selects and what `tuner.as_model(name)` looks up.
    `model_for(tuner, **kwargs)` returns the library's chat-model object pointed at the episode's
    gateway endpoint (base URL + episode key), so the agent runs unchanged. Import the library inside
    methods, never at module level: the CLI must start without it.

    `tuner_methods` names the convenience methods the framework adds to `ModelTuner`, so that the core
    never names a plugin: `("as_agentscope_model",)` makes `tuner.as_agentscope_model(**kwargs)` mean
    `tuner.as_model("agentscope", **kwargs)`. Each name starts with `as_` (the tuner looks only those
    up) and must not be one of the tuner's own methods (those win); no two frameworks may add the same.
    """

    name: ClassVar[str] = ""
    tuner_methods: ClassVar[tuple[str, ...]] = ()

    def setup(self, run_dir: Path) -> None:
        """Called once before rollouts start (e.g. to redirect a library's log folder into run_dir)."""

    def model_for(self, tuner: ModelTuner, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement model_for(tuner)")
