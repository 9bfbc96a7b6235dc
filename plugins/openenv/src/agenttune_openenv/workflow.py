"""`TextEnvWorkflow`: any text-in, text-out OpenEnv environment played by the model under training.

    workflow: agenttune_openenv:TextEnvWorkflow
    openenv:
      app: my_env.server.app:app
      text:
        action_field: message          # the action's field the model's reply goes into (default: read from
                                       # the server's /schema: the action's one string field)
        observation_field: prompt      # the observation's field shown to the model (default: its one text
                                       # field, else all of its fields as JSON)
        system_prompt: "Answer with a single number."

The loop: reset -> the observation as a user message -> the model's reply -> step({action_field:
reply}) -> the next observation as a user message ... until the environment says done, or
`rollout.max_turns` replies. The rewards go to the `openenv` judge. The model's calls go through the
episode's gateway, so every token trained is a token sampled.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agenttune.plugin_api import EnvironmentFailure, ModelTuner, Task, UserError, Workflow, WorkflowOutput
from agenttune_openenv.section import OpenEnvSection, TextOptions
from agenttune_openenv.session import OpenEnvSession, StepResult, openenv_for

# Observation fields that are bookkeeping, not something to show the model.
BOOKKEEPING = frozenset({"done", "reward", "metadata"})
_ACTION_FIELDS: dict[str, str] = {}  # server URL -> the action field read from its /schema


class TextEnvWorkflow(Workflow):
    """The model plays a text OpenEnv environment, one reply per step."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        options = text_options(tuner)
        env = openenv_for(task, tuner)
        result = await env.reset()
        action_field = options.action_field or await schema_action_field(env)
        messages: list[Any] = first_messages(task, options, result)  # the OpenAI client types its own dicts
        client = tuner.as_async_openai_client()
        for _ in range(tuner.config.rollout.max_turns):
            if result.done:
                break
            reply = await client.chat.completions.create(model=tuner.model_name, messages=messages)
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            result = await env.step({action_field: text})
            if not result.done:
                messages.append({"role": "user", "content": observation_text(result, options.observation_field)})
        return WorkflowOutput(metadata={"env_steps": env.steps, "env_done": env.done, "env_rewards": env.rewards,
                                        "final_observation": observation_text(result, options.observation_field)})


def text_options(tuner: ModelTuner) -> TextOptions:
    return tuner.config.section("openenv", OpenEnvSection).text


def first_messages(task: Task, options: TextOptions, result: StepResult) -> list[dict[str, Any]]:
    observation = observation_text(result, options.observation_field)
    user = f"{task.query}\n\n{observation}" if task.query else observation
    system = [{"role": "system", "content": options.system_prompt}] if options.system_prompt else []
    return [*system, {"role": "user", "content": user}]


def observation_text(result: StepResult, field: str | None) -> str:
    """What the model reads of an observation: the named field, its only text field, or its fields as JSON."""
    shown = {key: value for key, value in result.observation.items() if key not in BOOKKEEPING}
    if field is not None:
        if field not in shown:
            raise UserError(f"openenv.text.observation_field is {field!r}, but the environment's observation has "
                            f"the fields {sorted(shown)}.", hint="Name one of them.")
        return str(shown[field])
    texts = [value for value in shown.values() if isinstance(value, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(shown, ensure_ascii=False, default=str)


async def schema_action_field(env: OpenEnvSession) -> str:
    """The action's one string field, from the server's /schema (once per server)."""
    if env.url in _ACTION_FIELDS:
        return _ACTION_FIELDS[env.url]
    try:
        async with httpx.AsyncClient(timeout=env.spec.message_timeout) as client:
            response = await client.get(f"{env.url}/schema")
            response.raise_for_status()
            schema = response.json().get("action", {})
    except (httpx.HTTPError, ValueError) as error:
        raise EnvironmentFailure(f"could not read the action schema at {env.url}/schema: {error}") from error
    _ACTION_FIELDS[env.url] = pick_action_field(schema)
    return _ACTION_FIELDS[env.url]


def pick_action_field(schema: dict[str, Any]) -> str:
    properties = {name: spec for name, spec in (schema.get("properties") or {}).items() if name != "metadata"}
    strings = [name for name, spec in properties.items() if isinstance(spec, dict) and spec.get("type") == "string"]
    required = [name for name in strings if name in (schema.get("required") or [])]
    for candidates in (required, strings):
        if len(candidates) == 1:
            return candidates[0]
    raise UserError(f"The environment's action has the fields {sorted(properties)}, and agenttune cannot tell which "
                    "one the model's reply goes into.",
                    hint="Set openenv.text.action_field, or write a workflow of your own with openenv_for().")
