"""`tuner.as_<x>(...)` methods come from agent framework plugins (`AgentFramework.tuner_methods`).

The core names no plugin: a framework registered by a test adds its method to every tuner, as
agenttune-plugin-agentscope adds `as_agentscope_model`. The tuners are real, on a real gateway's
episode channel, and get their frameworks from the run's `FrameworkLoader`.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass
from typing import Any

import pytest

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.components.frameworks.base import AgentFramework
from agenttune.errors import PluginError
from agenttune.rollout.framework_loader import FrameworkLoader
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EpisodeStatus
from agenttune.workflow.tuner import ModelTuner


@dataclass
class ToyModel:
    api_key: str
    options: dict[str, Any]


class ToyFramework(AgentFramework):
    name = "toy"
    tuner_methods = ("as_toy_model",)

    def model_for(self, tuner: ModelTuner, *, agent: str | None = None, **kwargs: Any) -> ToyModel:
        return ToyModel(tuner.api_key_for(agent), kwargs)


class ClashingFramework(AgentFramework):
    name = "other_toy"
    tuner_methods = ("as_toy_model",)


@pytest.fixture
async def tuner(register_plugin, tmp_path):
    register_plugin(agent_frameworks=[ToyFramework])
    async with running_gateway(ScriptedEngine(tokenizer=tiny_tokenizer()), http=False) as gateway:
        channel = gateway.open_episode("e1")
        yield ModelTuner(channel, Task(task_id="t", query="q"), tiny_config(), FrameworkLoader(tmp_path))


def test_a_framework_method_is_as_model_of_that_framework(tuner):
    model = tuner.as_toy_model(agent="critic", temperature=0.5)
    assert model == ToyModel(f"{tuner.api_key}.critic", {"temperature": 0.5})
    assert model == tuner.as_model("toy", agent="critic", temperature=0.5)
    assert "as_model('toy', **kwargs)" in tuner.as_toy_model.__doc__


def test_a_method_no_framework_adds_says_what_to_install(tuner):
    with pytest.raises(AttributeError) as raised:
        tuner.as_nowhere_model()  # like as_agentscope_model where agenttune-plugin-agentscope is missing
    message = str(raised.value)
    assert "no attribute 'as_nowhere_model'" in message and "no installed agent framework" in message
    assert "pip install agenttune-plugin-nowhere" in message and "agenttune plugins list" in message
    assert not hasattr(tuner, "as_nothing_at_all")


def test_other_missing_attributes_are_plain_attribute_errors(tuner):
    with pytest.raises(AttributeError, match=r"^'ModelTuner' object has no attribute 'toy_model'$"):
        tuner.toy_model  # noqa: B018
    with pytest.raises(AttributeError, match="__no_such_dunder__"):
        tuner.__no_such_dunder__  # noqa: B018


def test_a_tuner_made_without_frameworks_says_so(tuner):
    bare = ModelTuner(tuner.channel, tuner.task, tuner.config)
    with pytest.raises(AttributeError, match="made without agent frameworks"):
        bare.as_toy_model()


def test_copying_and_unpickling_do_not_recurse(tuner):
    # Both build the copy without __init__ and probe it for dunders before `frameworks` is set.
    assert copy.copy(tuner).as_toy_model().api_key == tuner.api_key
    # no channel: a live gateway channel does not pickle, and it is not what is checked here
    revived = pickle.loads(pickle.dumps(ModelTuner(None, tuner.task, tuner.config)))
    assert revived.task == tuner.task and revived.frameworks is None


def test_two_frameworks_adding_one_method_is_a_plugin_error(tuner, register_plugin):
    register_plugin(agent_frameworks=[ClashingFramework])
    with pytest.raises(PluginError, match="other_toy and toy both add it"):
        tuner.as_toy_model()


async def test_a_workflow_gets_the_method_from_the_rollout_engine(register_plugin):
    register_plugin(agent_frameworks=[ToyFramework])

    class UsesToy(Workflow):
        async def execute(self, task, tuner):
            model = tuner.as_toy_model(agent="solver", seed=7)
            right = model == ToyModel(tuner.api_key_for("solver"), {"seed": 7})
            return WorkflowOutput(reward=1.0 if right else 0.0)

    config = tiny_config(rollout={"num_repeat": 1})
    async with running_gateway(ScriptedEngine(tokenizer=tiny_tokenizer()), config=config) as gateway:
        async with RolloutEngine(config, gateway, UsesToy) as rollout:
            [episode] = await rollout.run_tasks([Task(task_id="a", query="q")])
    assert episode.status is EpisodeStatus.OK, episode.error
    assert episode.reward == 1.0
