"""AWorld Train's entry point, on agenttune: `AgentTrainer(agent, config, reward_func, train_dataset,
test_dataset).train()`.

    from agenttune_aworld import AgentTrainer

    trainer = AgentTrainer(agent=gaia_agent,                   # an AWorld Agent, or a function making one
                           config="gaia_aworld.yaml",          # agenttune's config: backbone, model, ...
                           reward_func=gaia_reward_func,       # (data_source, solution_str, ground_truth, extra_info)
                           train_dataset=train, test_dataset=test)   # paths or datasets.Dataset
    trainer.train()

The same shape as AWorld 0.3.2's `train.trainer.agent_trainer.AgentTrainer`, with two differences:
`config` is an agenttune config (a YAML path, a dict or an AgentTuneConfig; verl settings go under its
`verl:` section) and the backbone (local, debug, verl, trinity) comes from it, or from
`train_engine_name`/`backbone`. Everything runs through `agenttune.Trainer`, the code path of
`agenttune train`: the agent runs as `agenttune_aworld.AgentWorkflow`, the reward function as the
`reward_function` judge.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agenttune.plugin_api import Trainer, UserError, load_config, reference_for, with_changes
from agenttune_aworld.options import AWorldOptions

if TYPE_CHECKING:
    from agenttune.plugin_api import Run

WORKFLOW = "agenttune_aworld.workflow:AgentWorkflow"


class AgentTrainer:
    """Trains an AWorld agent: the agent, the data, the reward and the config, then `train()`."""

    def __init__(
        self,
        agent: Any,
        config: str | os.PathLike[str] | dict[str, Any] | Any = None,
        reward_func: Callable[..., Any] | type | str | None = None,
        train_dataset: Any = None,
        test_dataset: Any = None,
        run_path: str | os.PathLike[str] | None = None,
        train_engine_name: str | None = None,
        *,
        backbone: str | None = None,
        overrides: Sequence[str] = (),
    ):
        if agent is None or agent == "":
            raise UserError("AgentTrainer needs an agent.",
                            hint="Pass agent=an AWorld Agent, a function returning one, or 'module:NAME'.")
        base = load_config(config, list(overrides), backbone=backbone or train_engine_name)
        configured = with_changes(base, {
            "agent_framework": "aworld",
            "aworld": {**base.section("aworld", AWorldOptions).model_dump(), "agent": agent_reference(agent)},
        })
        judge, judge_options = reward_judge(reward_func, configured)
        if judge_options:
            configured = with_changes(configured, {"judge": {**configured.judge.model_dump(), **judge_options}})
        self.trainer = Trainer(configured, workflow=WORKFLOW, judge=judge, train_dataset=train_dataset,
                               test_dataset=test_dataset, run_dir=run_path)
        self.config = self.trainer.config

    def train(self) -> Run:
        """Run the training (or, with the debug backbone, the rollouts); returns the agenttune Run."""
        return self.trainer.train()


def agent_reference(agent: Any) -> str:
    """'module:NAME' for the agent: a reference as given, an AWorld agent config file, or the object."""
    if isinstance(agent, (str, os.PathLike)):
        text = os.fspath(agent)
        if text.endswith((".yaml", ".yml")):
            return reference_for(_agent_from_file(text), label="agent")
        from agenttune.plugin_api import load_reference

        load_reference(text, key="agent")  # a wrong reference fails here, not in every episode
        return text
    return reference_for(agent, label="agent")


def reward_judge(reward_func: Any, config: Any) -> tuple[type | str | None, dict[str, Any]]:
    """The judge for `reward_func` and the judge options it needs.

    A reward function (or 'module:function', 'file.py[:function]') becomes the `reward_function`
    judge; an agenttune Judge class, 'module:JudgeClass' or a judge name is used as it is; None keeps
    the config's judge.
    """
    from agenttune.plugin_api import Judge

    if reward_func is None:
        if config.judge.type is None and not config.judge.judge_protocol:
            raise UserError("AgentTrainer has no reward: reward_func is None and the config names no judge.",
                            hint="Pass reward_func=a function (data_source, solution_str, ground_truth, extra_info), "
                                 "or an agenttune Judge.")
        return None, {}
    if isinstance(reward_func, type) and issubclass(reward_func, Judge):
        return reward_func, {}
    if isinstance(reward_func, str):
        target = _loaded_or_none(reward_func)
        if target is None or (isinstance(target, type) and issubclass(target, Judge)):
            return reward_func, {}  # a judge name or a Judge class reference
        return "reward_function", {"function": reward_func}
    if callable(reward_func):
        from agenttune_aworld.reward import check_signature

        check_signature(reward_func, getattr(reward_func, "__qualname__", repr(reward_func)))
        return "reward_function", {"function": reference_for(reward_func, label="reward")}
    raise UserError(f"reward_func is a {type(reward_func).__name__}.",
                    hint="Pass a function (data_source, solution_str, ground_truth, extra_info), an agenttune "
                         "Judge class, or 'module:name'.")


def _loaded_or_none(text: str) -> Any:
    """What a 'module:name' string names; None for a judge name; the path for a .py file."""
    if text.endswith(".py") or ".py:" in text:
        return text
    if ":" not in text and "->" not in text:
        return None
    from agenttune.plugin_api import load_reference

    return load_reference(text, key="reward_func")


def _agent_from_file(path: str) -> Any:
    """An Agent from an AWorld agent config file (AWorld Train's `agent='agent.yaml'`)."""
    from aworld.agents.llm_agent import Agent
    from aworld.config import AgentConfig
    from aworld.config import load_config as load_aworld_config

    if not os.path.isfile(path):
        raise UserError(f"AgentTrainer(agent={path!r}): the file does not exist.", hint="Check the path.")
    settings = load_aworld_config(os.path.basename(path), os.path.dirname(os.path.abspath(path)))
    if not settings:
        raise UserError(f"AgentTrainer(agent={path!r}): AWorld read no agent settings from it.",
                        hint="It must hold Agent(...) keyword arguments: name, system_prompt, mcp_config, ...")
    if isinstance(settings.get("conf"), dict):  # Agent takes a dict only when it has every AgentConfig field
        settings["conf"] = AgentConfig(**settings["conf"])
    return Agent(**settings)
