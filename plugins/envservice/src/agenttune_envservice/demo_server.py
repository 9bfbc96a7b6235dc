"""A small EnvService server: a multi-turn number-guessing game that speaks the real protocol.

    python -m agenttune_envservice.demo_server --port 8080

It answers the same endpoints, bodies and envelopes as the AppWorld EnvService (`/get_env_profile`,
`/create`, `/step`, `/evaluate`, `/get_info`, `/release`, `GET /healthz`; `{"success": true,
"data": ...}`; 400 for a bad request or an unknown instance, 500 when the environment fails), so a
config, workflow and judge written against it run unchanged against AppWorld. Use it to try the
plugin without AppWorld, and in tests.

The game (env_type `guess`): every task has a secret number from 1 to 10; the agent guesses, the
environment answers "higher" or "lower", and the episode ends on a right guess or after
`--max-steps` guesses. `evaluate` with `sparse: true` gives 1.0 for a win, else 0.0; dense gives
partial credit for the last guess's distance.

Fault injection, for tests of the client's resilience:
    --fail-every N      answer every N-th POST with 503 before acting on it
    --delay S           wait S seconds before answering every POST
    --exit-after-steps N   exit the process (code 3) on the N-th /step, mid-episode
`GET /_stats` reports live instances and request counters.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

SYSTEM_PROMPT = ("You are playing a guessing game. I think of a whole number from 1 to 10. Answer with one "
                 "number; I will tell you whether mine is higher or lower.")


@dataclass
class Game:
    task_id: str
    secret: int
    max_steps: int
    tries: int = 0
    last_guess: int | None = None
    won: bool = False

    @property
    def over(self) -> bool:
        return self.won or self.tries >= self.max_steps


@dataclass
class Faults:
    fail_every: int = 0
    delay: float = 0.0
    exit_after_steps: int = 0


def secret_of(task_id: str) -> int:
    """Each task's number, fixed by its id (so tests know the answers)."""
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 10 + 1


class GuessService:
    """The environment logic, separate from HTTP."""

    env_type = "guess"

    def __init__(self, tasks_per_split: int = 8, max_steps: int = 4):
        self.tasks_per_split = tasks_per_split
        self.max_steps = max_steps
        self.games: dict[str, Game] = {}
        self.created = 0
        self.released = 0

    def profile(self, env_type: str, split: str) -> list[str]:
        self._check_type(env_type)
        if split not in ("train", "val", "test"):
            raise ValueError(f"unknown split {split!r}: train, val or test")
        return [f"{split}-{index}" for index in range(self.tasks_per_split)]

    def create(self, env_type: str, task_id: str, instance_id: str | None) -> dict[str, Any]:
        self._check_type(env_type)
        if not task_id:
            raise ValueError("task_id is required")
        instance_id = instance_id or f"guess-{os.urandom(4).hex()}"
        if instance_id in self.games:
            raise ValueError(f"instance {instance_id} exists already")
        self.games[instance_id] = Game(task_id, secret_of(task_id), self.max_steps)
        self.created += 1
        state = [{"role": "system", "content": SYSTEM_PROMPT},
                 {"role": "user", "content": f"Task {task_id}: guess my number. You have {self.max_steps} tries."}]
        return {"state": state, "reward": 0, "is_terminated": False,
                "info": {"instance_id": instance_id, "task_id": task_id}}

    def step(self, instance_id: str, action: dict[str, Any]) -> dict[str, Any]:
        game = self._game(instance_id)
        if "content" not in action:
            raise ValueError("the action needs a content")
        if game.over:
            raise ValueError(f"instance {instance_id} has terminated")
        match = re.search(r"-?\d+", str(action["content"]))
        game.tries += 1
        if match is None:
            text = "That is not a number. Answer with one number from 1 to 10."
        else:
            game.last_guess = int(match.group())
            game.won = game.last_guess == game.secret
            text = "Correct!" if game.won else "Higher." if game.last_guess < game.secret else "Lower."
        reward = 1.0 if game.won else 0.0
        if game.over and not game.won:
            text += f" No tries left; it was {game.secret}."
        return {"state": [{"role": "user", "content": text}], "reward": reward, "is_terminated": game.over,
                "info": {"instance_id": instance_id, "task_id": game.task_id, "tries": game.tries}}

    def evaluate(self, instance_id: str, params: dict[str, Any]) -> float:
        game = self._game(instance_id)
        if game.won:
            return 1.0
        if params.get("sparse", True) or game.last_guess is None:
            return 0.0
        return max(0.0, 0.5 - abs(game.last_guess - game.secret) / 20)

    def info(self, instance_id: str) -> dict[str, Any]:
        game = self._game(instance_id)
        return {"task_id": game.task_id, "tries": game.tries, "max_steps": game.max_steps, "tools": []}

    def release(self, instance_id: str) -> bool:
        known = self.games.pop(instance_id, None) is not None
        self.released += known
        return known

    def _game(self, instance_id: str | None) -> Game:
        if not instance_id:
            raise ValueError("instance_id is required")
        if instance_id not in self.games:
            raise ValueError(f"Instance {instance_id} not found!")
        return self.games[instance_id]

    def _check_type(self, env_type: str | None) -> None:
        if env_type != self.env_type:
            raise ValueError(f"unknown env_type {env_type!r}: this server runs {self.env_type!r}")


def build_app(service: GuessService, faults: Faults | None = None) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    faults = faults or Faults()
    counters = {"posts": 0, "steps": 0, "failed_on_purpose": 0}

    def handler(action: Any) -> Any:
        async def endpoint(request: Request) -> Any:
            counters["posts"] += 1
            if faults.delay:
                await asyncio.sleep(faults.delay)
            if faults.fail_every and counters["posts"] % faults.fail_every == 0:
                counters["failed_on_purpose"] += 1
                return JSONResponse({"detail": "injected failure: service unavailable"}, status_code=503)
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse({"detail": "the body is not JSON"}, status_code=400)
            try:
                return JSONResponse(action(body))
            except ValueError as error:  # as the reference server: bad requests and unknown instances
                return JSONResponse({"detail": str(error)}, status_code=400)
            except Exception as error:  # the environment itself failed
                return JSONResponse({"detail": f"{type(error).__name__}: {error}"}, status_code=500)
        return endpoint

    def step(body: dict[str, Any]) -> dict[str, Any]:
        counters["steps"] += 1
        if faults.exit_after_steps and counters["steps"] >= faults.exit_after_steps:
            os._exit(3)  # the server dies mid-episode, as a crashed environment would
        return {"success": True, "data": service.step(body.get("instance_id", ""), body.get("messages") or {})}

    routes = [
        Route("/healthz", lambda request: PlainTextResponse("OK"), methods=["GET"]),
        Route("/_stats", lambda request: JSONResponse({
            "live": sorted(service.games), "created": service.created, "released": service.released, **counters,
        }), methods=["GET"]),
        Route("/get_env_profile", handler(lambda body: {"success": True, "data": service.profile(
            body.get("env_type"), (body.get("params") or {}).get("split", "train"))}), methods=["POST"]),
        Route("/create", handler(lambda body: {"success": True, "data": service.create(
            body.get("env_type"), body.get("task_id"), body.get("instance_id"))}), methods=["POST"]),
        Route("/step", handler(step), methods=["POST"]),
        Route("/evaluate", handler(lambda body: {"success": True, "data": service.evaluate(
            body.get("instance_id"), body.get("params") or {})}), methods=["POST"]),
        Route("/get_info", handler(lambda body: {"success": True, "data": service.info(body.get("instance_id"))}),
              methods=["POST"]),
        Route("/release", handler(lambda body: {"success": service.release(body.get("instance_id")), "data": None}),
              methods=["POST"]),
    ]
    return Starlette(routes=routes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A small EnvService server (a number-guessing game).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--tasks", type=int, default=8, help="Tasks per split.")
    parser.add_argument("--max-steps", type=int, default=4, help="Guesses per episode.")
    parser.add_argument("--fail-every", type=int, default=0, help="Answer every N-th POST with 503.")
    parser.add_argument("--delay", type=float, default=0.0, help="Seconds to wait before answering a POST.")
    parser.add_argument("--exit-after-steps", type=int, default=0, help="Exit on the N-th /step (code 3).")
    args = parser.parse_args(argv)

    import uvicorn

    service = GuessService(tasks_per_split=args.tasks, max_steps=args.max_steps)
    faults = Faults(fail_every=args.fail_every, delay=args.delay, exit_after_steps=args.exit_after_steps)
    uvicorn.run(build_app(service, faults), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
