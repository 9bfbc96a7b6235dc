"""verifiers 0.3.1's own evaluation and agenttune's validation agree on a 0.1-0.3 environment and model.

One scripted policy (answers depend only on the prompt) behind agenttune's gateway. verifiers evaluates as
`vf-eval` does (`Environment.run_rollout`: its rollout, scored by its Rubric); agenttune validates through
the reader, VerifiersWorkflow and the verifiers judge. Per task and on average, the rewards must be equal.
"""

from __future__ import annotations

import re

import pytest

from agenttune.plugin_api import Gateway, RolloutEngine, ScriptedEngine, get_component
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import tiny_config

WORDS_ANSWERED = {"ocean", "maple", "frost"}  # the policy says these back; others it garbles


def policy(tokenizer):
    def respond(prompt_ids, sampling):
        word = re.findall(r"Say (\w+)", tokenizer.decode(prompt_ids))[-1]
        return word if word in WORDS_ANSWERED else word.upper()
    return respond


async def verifiers_own_eval(base_url: str, num_tasks: int) -> dict[str, float]:
    from agenttune_verifiers.legacy.loading import load_legacy_env
    from verifiers.legacy.types import ClientConfig

    env = load_legacy_env({"id": "vf03-say-word", "args": {"num_eval_tasks": num_tasks}, "max_turns": None,
                           "timeout": None})
    client = ClientConfig(api_base_url=base_url, api_key_var="UNSET_KEY", max_retries=0)
    rewards = {}
    for row in env.get_eval_dataset():
        output = await env.run_rollout(dict(row), client, "tiny", {})  # verifiers scores it itself
        rewards[f"test-{row['example_id']}"] = output["reward"]
    return rewards


@pytest.mark.timeout(240)
async def test_verifiers_eval_and_agenttune_validation_give_the_same_rewards() -> None:
    tokenizer = tiny_tokenizer()
    num_tasks = 6
    reader_options = {"id": "vf03-say-word", "args": {"num_eval_tasks": num_tasks}}
    config = tiny_config(task_reader={"type": "verifiers", **reader_options, "validation_split": "test"},
                         judge={"type": "verifiers", "isolation": "thread"}, rollout={"num_repeat": 1})
    async with Gateway(ScriptedEngine(tokenizer=tokenizer, responder=policy(tokenizer)), tokenizer, config,
                       open_access=True) as served:
        own = await verifiers_own_eval(served.base_url, num_tasks)

    reader_cls = get_component("task_readers", "verifiers")
    tasks = list(reader_cls(reader_cls.Options(**reader_options)).read("test"))
    from agenttune_verifiers import VerifiersWorkflow

    async with Gateway(ScriptedEngine(tokenizer=tokenizer, responder=policy(tokenizer)), tokenizer,
                       config) as gateway:
        episodes = await RolloutEngine(config, gateway, VerifiersWorkflow, get_component("judges", "verifiers")()
                                       ).run_tasks(tasks)
    validation = {episode.task.task_id: episode.reward for episode in episodes}

    assert own == validation
    assert sorted(set(own.values())) == [0.0, 1.0]  # the policy is right on some tasks and wrong on others
    assert sum(own.values()) / num_tasks == sum(validation.values()) / num_tasks == 3 / 6
