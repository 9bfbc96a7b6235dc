"""An MCP tool environment written against openenv 0.10's server API: arithmetic with two tools.

reset(seed) asks "What is A + 3?" (A from the seed). Tools: `add(a, b)` returns a + b (reward 0.1);
`answer(value)` ends the episode (reward 1.0 when value is right, else 0.0). The tools are MCP tools
(FastMCP) of an MCPEnvironment; the agent reaches them by step(ListToolsAction / CallToolAction).
The server counts each tool's calls in /_stats ("tool:add", "tool:answer").
"""

from __future__ import annotations

import random
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

from test_servers.counting import add_stats_route, count, on_close, on_reset, on_step

ADD_REWARD = 0.1
MAX_CALLS = 6


def question_for(seed: int | None) -> tuple[int, int]:
    return random.Random(seed).randint(0, 9), 3


class ArithmeticObservation(Observation):
    prompt: str = ""


class ArithmeticEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("arithmetic")
        self._a, self._b = question_for(0)
        self._reward: float = 0.0
        self._done = False
        self._state = State(step_count=0)

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two whole numbers."""
            self._reward = ADD_REWARD
            return a + b

        @mcp.tool()
        def answer(value: int) -> str:
            """Give the final answer to the question."""
            right = value == self._a + self._b
            self._reward, self._done = (1.0 if right else 0.0), True
            return "right" if right else "wrong"

        super().__init__(mcp)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ArithmeticObservation:
        on_reset(self)
        self._a, self._b = question_for(seed)
        self._done = False
        self._state = State(episode_id=episode_id, step_count=0)
        return ArithmeticObservation(prompt=f"What is {self._a} + {self._b}? Use the tools, then call answer.")

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """MCPEnvironment's tool routing, with this environment's rewards put on the tool calls."""
        self._reward = 0.0
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction):
            on_step(self, False)
            count(f"tool:{action.tool_name}")
            self._state.step_count += 1
            observation.reward = self._reward
            observation.done = self._done or self._state.step_count >= MAX_CALLS
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return ArithmeticObservation(prompt="Only tool calls are understood here.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        on_close(self)
        super().close()


app = add_stats_route(create_app(ArithmeticEnvironment, CallToolAction, CallToolObservation, env_name="arithmetic",
                                 max_concurrent_envs=64))
