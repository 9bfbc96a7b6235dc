"""verifiers' own evaluation and agenttune's validation agree on the same model and environment.

The model is one scripted policy (answers depend only on the prompt) behind agenttune's gateway. verifiers
evaluates as `vf-eval` does (its Env runs and scores each episode itself, against an OpenAI endpoint);
agenttune validates through the reader, VerifiersWorkflow and the verifiers judge. Per task and on
average, the rewards must be equal.
"""

from __future__ import annotations

import re

import pytest

from agenttune.plugin_api import Gateway, RolloutEngine, ScriptedEngine, get_component
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import tiny_config

WORDS_ANSWERED = {"apple", "stone", "amber", "ocean", "frost"}  # the policy says these back; others it garbles


def policy(tokenizer):
    def respond(prompt_ids, sampling):
        word = re.findall(r"Say (\w+)", tokenizer.decode(prompt_ids))[-1]
        return word if word in WORDS_ANSWERED else word.upper()
    return respond


def reader_options(num_tasks: int) -> dict:
    return {"type": "verifiers", "id": "vf-say-word", "args": {"num_tasks": num_tasks}, "validation_split": "test"}


async def verifiers_own_eval(base_url: str, num_tasks: int) -> dict[str, float]:
    import verifiers.v1 as vf
    from agenttune_verifiers.loading import load_env

    env = load_env({"taskset": {"id": "vf-say-word", "num_tasks": num_tasks},
                    "agent": {"runtime": {"type": "subprocess"}}})
    ctx = vf.ModelContext(model="tiny", client=vf.EvalClientConfig(base_url=base_url, api_key_var="UNSET_KEY"))
    rewards = {}
    async with env.serving():
        for task in env.taskset:
            episode = await env.run_episode(task, ctx)  # verifiers scores it itself
            assert episode.ok, episode.errors
            rewards[task.data.id] = episode.traces[0].reward
    return rewards


@pytest.mark.timeout(240)
async def test_verifiers_eval_and_agenttune_validation_give_the_same_rewards() -> None:
    tokenizer = tiny_tokenizer()
    num_tasks = 4  # apple, river, stone, cloud: the policy says apple and stone back
    config = tiny_config(task_reader=reader_options(num_tasks), judge={"type": "verifiers", "isolation": "thread"},
                         rollout={"num_repeat": 1, "max_env_worker": 4})
    async with Gateway(ScriptedEngine(tokenizer=tokenizer, responder=policy(tokenizer)), tokenizer, config,
                       open_access=True) as served:
        own = await verifiers_own_eval(served.base_url, num_tasks)

    reader_cls = get_component("task_readers", "verifiers")
    reader = reader_cls(reader_cls.Options(id="vf-say-word", args={"num_tasks": num_tasks}))
    tasks = list(reader.read("test"))
    judge = get_component("judges", "verifiers")()
    from agenttune_verifiers import VerifiersWorkflow

    async with Gateway(ScriptedEngine(tokenizer=tokenizer, responder=policy(tokenizer)), tokenizer,
                       config) as gateway:
        episodes = await RolloutEngine(config, gateway, VerifiersWorkflow, judge).run_tasks(tasks)
    validation = {episode.task.task_id: episode.reward for episode in episodes}

    assert own == validation
    assert sorted(set(own.values())) == [0.0, 1.0]  # the policy is right on some tasks and wrong on others
    assert sum(own.values()) / num_tasks == sum(validation.values()) / num_tasks == 2 / 4
