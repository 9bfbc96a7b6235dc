"""Guess-the-digit as an OpenEnv environment (openenv 0.10's server API), served by agenttune with the run.

reset(seed) picks a secret digit from the seed. Each step reads the first digit of the reply:
right -> reward 1.0, done; a wrong digit -> reward 0.1 and a hint (higher / lower); no digit at all ->
reward 0.0. Three guesses. Run it alone with `uvicorn guess_game:app --port 8000` (from this folder).
"""

from __future__ import annotations

import random
import re
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

MAX_GUESSES = 3


class GuessAction(Action):
    guess: str  # the model's reply; agenttune's TextEnvWorkflow finds this field in /schema


class GuessObservation(Observation):
    prompt: str = ""


class GuessState(State):
    secret: int = 0


class GuessGame(Environment[GuessAction, GuessObservation, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session's state is its own: many episodes at once

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = GuessState(episode_id=episode_id, step_count=0, secret=random.Random(seed).randint(0, 9))
        return GuessObservation(prompt="I am thinking of a digit from 0 to 9. Guess it: answer with one digit.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        over = self._state.step_count >= MAX_GUESSES
        found = re.search(r"\d", action.guess)
        if found is None:
            return GuessObservation(prompt="That is not a digit. Answer with one digit.", reward=0.0, done=over)
        guess = int(found.group())
        if guess == self._state.secret:
            return GuessObservation(prompt="Right!", reward=1.0, done=True)
        hint = "higher" if guess < self._state.secret else "lower"
        return GuessObservation(prompt=f"No, {hint}.", reward=0.1, done=over)

    @property
    def state(self) -> GuessState:
        return self._state


app = create_app(GuessGame, GuessAction, GuessObservation, env_name="guess_game", state_cls=GuessState,
                 max_concurrent_envs=64)
