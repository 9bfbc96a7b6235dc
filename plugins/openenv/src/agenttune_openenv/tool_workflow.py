"""`ToolEnvWorkflow`: an OpenEnv MCP tool environment, its tools given to the model as function tools.

    workflow: agenttune_openenv:ToolEnvWorkflow
    openenv:
      app: my_env.server.app:app       # an MCPEnvironment, served with create_app(env, CallToolAction, ...)
      text:
        system_prompt: "Use the tools, then call answer."   # optional; observation_field also applies

The loop: reset -> the observation as a user message -> the environment's tools (ListToolsAction)
become the request's OpenAI `tools` (each MCP tool's input schema is the function's parameters) ->
each tool call of the model's reply is one step, CallToolAction(tool_name, arguments), its result a
`tool` message -> the model again ... until the environment says done, the model replies without a
tool call (its answer: the episode ends there), or `rollout.max_turns` replies. The steps' rewards go
to the `openenv` judge; listing the tools is not a step. Arguments that are not a JSON object are
answered with an error message and not sent. The model's calls go through the episode's gateway,
which parses the tool calls (`model.tool_parser`), so every token trained is a token sampled.
"""

from __future__ import annotations

import json
from typing import Any

from agenttune.plugin_api import ModelTuner, Task, Workflow, WorkflowOutput
from agenttune_openenv.session import OpenEnvSession, StepResult, openenv_for
from agenttune_openenv.workflow import first_messages, text_options


class ToolEnvWorkflow(Workflow):
    """The model uses an MCP tool environment's tools, one tool call per step."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        options = text_options(tuner)
        env = openenv_for(task, tuner)
        first = await env.reset()
        tools: list[Any] = [function_tool(tool) for tool in await env.list_tools()]
        messages: list[Any] = first_messages(task, options, first)  # the OpenAI client types its own dicts
        client = tuner.as_async_openai_client()
        calls = 0
        answer = ""
        for _ in range(tuner.config.rollout.max_turns):
            if env.done:
                break
            reply = await client.chat.completions.create(model=tuner.model_name, messages=messages, tools=tools)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            answer = message.content or ""
            if not message.tool_calls:
                break  # an answer without a tool call: the model is done, whatever the environment says
            for call in message.tool_calls:
                if env.done:  # an earlier call of this reply ended the episode
                    break
                calls += 1
                function = getattr(call, "function", None)  # OpenAI's types also allow custom tool calls
                content = await run_tool_call(env, function.name, function.arguments) if function else \
                    "error: only function tools are offered"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        return WorkflowOutput(metadata={"env_steps": env.steps, "env_done": env.done, "env_rewards": env.rewards,
                                        "tool_calls": calls, "final_answer": answer})


def function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool as an OpenAI function tool: its input schema is the function's parameters."""
    parameters = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": str(tool.get("name", "")),
                                             "description": str(tool.get("description") or ""),
                                             "parameters": parameters}}


async def run_tool_call(env: OpenEnvSession, name: str, arguments_json: str | None) -> str:
    """One tool call as one step; what the model reads back (the tool's result, or why it did not run)."""
    try:
        arguments = json.loads(arguments_json or "{}")
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        # Not sent: the environment's call_tool takes an object, and the model learns more from this.
        return f"error: the arguments of {name} must be a JSON object, not {arguments_json!r:.200}"
    return tool_result_text(await env.call_tool(name, arguments))


def tool_result_text(result: StepResult) -> str:
    """A CallToolObservation as text: the tool's text content, else its data, or the error."""
    observation = result.observation
    error = observation.get("error")
    if isinstance(error, dict):
        return f"error ({error.get('error_type', 'error')}): {error.get('message', '')}"
    outcome = observation.get("result")
    if not isinstance(outcome, dict):
        return outcome if isinstance(outcome, str) else json.dumps(outcome, ensure_ascii=False, default=str)
    texts = [part["text"] for part in outcome.get("content") or []
             if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)]
    text = "\n".join(texts) if texts else json.dumps(outcome.get("data"), ensure_ascii=False, default=str)
    failed = outcome.get("is_error") or outcome.get("isError")
    return f"error: {text}" if failed else text
