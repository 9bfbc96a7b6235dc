"""`VerifiersWorkflow`: one episode is the verifiers environment's own rollout, its model calls through the gateway.

verifiers 0.4 (`verifiers.v1`) here; 0.1-0.3 environments (a task whose metadata says `stack: legacy`)
in legacy/rollout.py, the same way.

The environment's client is an OpenAI-style `EvalClient` pointed at this episode's gateway URL (the key
in the path), so every model call, multi-turn and tool calls included, is recorded token by token as
sampled. Scoring is deferred to the `verifiers` judge, where agenttune's judge limits (timeout,
memory, process isolation) hold for the environment's reward functions.
"""

from __future__ import annotations

from typing import Any

from agenttune.plugin_api import EnvironmentFailure, ModelTuner, Task, Workflow, WorkflowOutput
from agenttune_verifiers.loading import load_env, task_from_data
from agenttune_verifiers.options import METADATA_KEY
from agenttune_verifiers.records import trace_summary

# verifiers reads the API key from this variable; left unset it sends "EMPTY": the key is in the URL path.
_UNSET_KEY_VARIABLE = "AGENTTUNE_VERIFIERS_UNUSED_KEY"


class VerifiersRolloutError(RuntimeError):
    """The rollout failed on the model's side (or unclassified); the message starts with verifiers' error kind
    (provider_error, ...). Failures of the environment itself raise EnvironmentFailure (environment_error)."""


class VerifiersWorkflow(Workflow):
    """Runs the task's verifiers environment (named in task_reader) on the model under training."""

    name = "verifiers"

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        spec = task.metadata.get(METADATA_KEY)
        if not isinstance(spec, dict):
            raise VerifiersRolloutError(f"task {task.task_id!r} does not come from a verifiers environment: set "
                                        "task_reader.type: verifiers")
        if spec.get("stack") == "legacy":
            state, state_summary = await _run_legacy(spec, tuner)
            tuner.update_judge_input_dictionary(verifiers_state=state)
            return WorkflowOutput(metadata={"verifiers": [state_summary]})
        env = load_env(spec["env"])
        vf_task = task_from_data(env, spec["task"]).defer_scoring()  # the judge scores (under its limits)
        episode = await _run_episode(env, vf_task, tuner)
        traces = [trace.model_dump(mode="json") for trace in episode.traces]
        tuner.update_judge_input_dictionary(verifiers_traces=traces)
        summary = [trace_summary(trace) for trace in episode.traces]
        if not episode.ok:
            raise rollout_failure([*episode.errors, *(e for trace in episode.traces for e in trace.errors)],
                                  episode.is_timeout, [trace.stop_condition for trace in episode.traces])
        return WorkflowOutput(metadata={"verifiers": summary})


async def _run_episode(env: Any, vf_task: Any, tuner: ModelTuner) -> Any:
    import verifiers.v1 as vf

    client = vf.EvalClientConfig(base_url=_keyed_url(tuner), api_key_var=_UNSET_KEY_VARIABLE)
    ctx = vf.ModelContext(model=tuner.model_name, client=client, sampling=vf.SamplingConfig())
    async with env.serving():
        return await env.run_episode(vf_task, ctx)


async def _run_legacy(spec: dict[str, Any], tuner: ModelTuner) -> tuple[dict[str, Any], dict[str, Any]]:
    from agenttune_verifiers.legacy.rollout import LegacyRolloutError, run_legacy_episode

    try:
        return await run_legacy_episode(spec, tuner)
    except LegacyRolloutError as error:  # the model's failure: a workflow_error, as on the 0.4 path
        raise VerifiersRolloutError(str(error)) from error


def _keyed_url(tuner: ModelTuner) -> str:
    """The gateway URL with this episode's key in the path: verifiers' client sends a fixed API key."""
    return f"{tuner.base_url.removesuffix('/v1')}/e/{tuner.api_key}/v1"


# verifiers 0.4's error boundaries (verifiers.v1.errors) on the environment's side: its task hooks, tool
# servers, custom Env.run, the box, the interception server, the harness failing to install, launch or
# finish. They end the episode environment_error. ProviderError (the model endpoint failed: agenttune's
# gateway or engine) and anything unclassified stay the workflow's failure, as before.
ENVIRONMENT_KINDS = frozenset({"TaskError", "ToolsetError", "EnvError", "SandboxError", "InterceptionError",
                               "TunnelError", "HarnessError"})


def rollout_failure(errors: list[Any], is_timeout: bool, stop_conditions: list[Any]) -> Exception:
    """The exception for a failed episode: `<kind>: <message>` of its first error (its own, else its
    traces'), kind in snake case; EnvironmentFailure when the environment caused it."""
    if not errors:
        return VerifiersRolloutError(f"verifiers_error: the episode did not complete (stop conditions "
                                     f"{stop_conditions})")
    error = errors[0]
    kind = "timeout" if is_timeout or error.type == "TimeoutError" else _snake(error.type)
    text = f"{kind}: {' '.join(error.message.split())[:1500]}"
    if kind != "timeout" and error.type in ENVIRONMENT_KINDS:
        return EnvironmentFailure(text)
    return VerifiersRolloutError(text)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
