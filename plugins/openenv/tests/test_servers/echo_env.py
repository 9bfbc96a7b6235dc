"""An echo environment written against openenv 0.10's server API: it says back what it is sent.

Reward: 0.1 per character echoed; done after two steps.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from test_servers.counting import add_stats_route, on_close, on_reset, on_step


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._hang = False
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              hang_on_step: bool = False, **kwargs: Any) -> EchoObservation:
        on_reset(self)
        self._hang = hang_on_step
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message=f"Echo ready (seed {seed}). Say something.")

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any) -> EchoObservation:
        on_step(self, self._hang)
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message, reward=0.1 * len(action.message),
                               done=self._state.step_count >= 2)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        on_close(self)


app = add_stats_route(create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo",
                                 max_concurrent_envs=64))
