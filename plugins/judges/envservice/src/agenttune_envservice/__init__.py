"""agenttune-plugin-envservice: environments served over the EnvService protocol (AppWorld and others).

    task_reader: {type: env_service, env_type: appworld}
    judge: {type: env_service}
    env_service: {command: ..., url: http://127.0.0.1:8080}     # optional: start the server with the run

In a workflow, `env = env_for(task, tuner)`, then `await env.reset()` and `await env.step(action)`.
"""

from agenttune_envservice.client import (
    EnvServiceClient,
    EnvServiceError,
    EnvServiceProtocolError,
    EnvServiceUnavailable,
)
from agenttune_envservice.environment import Environment, EnvSpec, env_for

__all__ = ["EnvServiceClient", "EnvServiceError", "EnvServiceProtocolError", "EnvServiceUnavailable", "EnvSpec",
           "Environment", "env_for"]
