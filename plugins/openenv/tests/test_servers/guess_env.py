"""Guess-the-digit, written against openenv 0.10's server API: a game with rewards.

reset(seed) picks a secret digit 0-9 from the seed. Each step reads the first digit of the guess:
right -> reward 1.0 and done; a wrong digit -> reward 0.1 and a hint (higher / lower); no digit ->
reward 0.0. The game ends after three guesses.
"""

from __future__ import annotations

import random
import re
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from test_servers.counting import add_stats_route, on_close, on_reset, on_step

MAX_GUESSES = 3


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    prompt: str = ""
    guesses_left: int = MAX_GUESSES


class GuessState(State):
    secret: int = 0


def secret_for(seed: int | None) -> int:
    return random.Random(seed).randint(0, 9)


class GuessEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._hang = False
        self._state = GuessState()

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              hang_on_step: bool = False, **kwargs: Any) -> GuessObservation:
        on_reset(self)
        self._hang = hang_on_step
        self._state = GuessState(episode_id=episode_id, step_count=0, secret=secret_for(seed))
        return GuessObservation(prompt="I am thinking of a digit from 0 to 9. Guess it.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        on_step(self, self._hang)
        self._state.step_count += 1
        left = MAX_GUESSES - self._state.step_count
        found = re.search(r"\d", action.guess)
        if found is None:
            return GuessObservation(prompt="Answer with one digit.", reward=0.0, done=left <= 0, guesses_left=left)
        guess = int(found.group())
        if guess == self._state.secret:
            return GuessObservation(prompt="Right!", reward=1.0, done=True, guesses_left=left)
        hint = "higher" if guess < self._state.secret else "lower"
        return GuessObservation(prompt=f"No, {hint}.", reward=0.1, done=left <= 0, guesses_left=left)

    @property
    def state(self) -> GuessState:
        return self._state

    def close(self) -> None:
        on_close(self)


app = add_stats_route(create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                                 state_cls=GuessState, max_concurrent_envs=64))
