"""The echo environment on a server that takes one session at a time (openenv's default limit).

A second session while one is open is refused with CAPACITY_REACHED until the first closes.
"""

from __future__ import annotations

from openenv.core.env_server.http_server import create_app

from test_servers.counting import add_stats_route
from test_servers.echo_env import EchoAction, EchoEnvironment, EchoObservation

app = add_stats_route(create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo-solo",
                                 max_concurrent_envs=1))
