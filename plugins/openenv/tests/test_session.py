"""The episode's OpenEnv session against real openenv servers on loopback: reset, step, state, close, timeouts."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from agenttune_openenv.section import OpenEnvSection
from agenttune_openenv.server import openenv_server_for_run
from agenttune_openenv.session import OpenEnvSession, OpenEnvSpec
from agenttune_openenv.workflow import observation_text, pick_action_field
from conftest import Server

from agenttune.plugin_api import EnvironmentFailure, UserError


def session(server_url: str, seed: int = 0, hang: bool = False, **spec: float) -> OpenEnvSession:
    reset = {"seed": seed, **({"hang_on_step": True} if hang else {})}
    return OpenEnvSession(OpenEnvSpec(url=server_url, reset=reset, **spec), f"task-{seed}")


async def wait_for_live(server: Server, live: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = server.stats()
        if stats["live"] == live or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.05)


async def test_an_echo_episode_steps_collects_rewards_and_releases_its_instance(echo_server):
    server = echo_server
    before = server.stats()
    env = session(server.url)
    first = await env.reset()
    assert first.observation["echoed_message"].startswith("Echo ready (seed 0)") and not first.done
    result = await env.step({"message": "hello"})
    assert result.observation["echoed_message"] == "hello" and result.reward == pytest.approx(0.5)
    assert not result.done
    result = await env.step({"message": "hi"})
    assert result.done and env.done and env.rewards == pytest.approx([0.5, 0.2])
    assert (await env.state())["step_count"] == 2
    assert server.stats()["live"] == 1
    await env.close()
    stats = await wait_for_live(server, 0)
    assert stats["live"] == 0 and stats["resets"] - before["resets"] == 1
    assert stats["closed_after_reset"] - before["closed_after_reset"] == 1


async def test_each_episode_has_its_own_instance(guess_server):
    server = guess_server
    envs = [session(server.url, seed) for seed in (1, 2, 3)]
    await asyncio.gather(*(env.reset() for env in envs))
    states = await asyncio.gather(*(env.state() for env in envs))
    assert server.stats()["live"] == 3
    await envs[0].step({"guess": "x"})  # a step in one instance moves only that one
    counts = [state["step_count"] for state in await asyncio.gather(*(env.state() for env in envs))]
    assert counts == [1, 0, 0]
    from test_servers.guess_env import secret_for

    assert [state["secret"] for state in states] == [secret_for(seed) for seed in (1, 2, 3)]
    await asyncio.gather(*(env.close() for env in envs))
    assert (await wait_for_live(server, 0))["live"] == 0


async def test_one_reset_per_session(echo_server):
    env = session(echo_server.url)
    await env.reset()
    with pytest.raises(RuntimeError, match="one instance per episode"):
        await env.reset()
    await env.close()
    with pytest.raises(RuntimeError, match="closed"):
        await env.step({"message": "late"})


async def test_a_server_that_never_answers_a_step_times_out(guess_server):
    env = session(guess_server.url, hang=True, message_timeout=1.0)
    await env.reset()
    started = time.monotonic()
    with pytest.raises(EnvironmentFailure, match=r"did not answer step within 1s"):
        await env.step({"guess": "5"})
    assert time.monotonic() - started < 8
    await env.close()


async def test_a_server_that_never_completes_the_handshake_times_out():
    with socket.socket() as listener:  # accepts connections, never says a word
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        env = session(f"http://127.0.0.1:{port}", connect_timeout=1.0, message_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(EnvironmentFailure, match="OpenEnv server"):
            await env.reset()
        assert time.monotonic() - started < 10
        await env.close()


async def test_no_server_at_all_is_an_environment_failure():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        env = session(f"http://127.0.0.1:{port}", connect_timeout=2.0)
        with pytest.raises(EnvironmentFailure, match="could not be reached for reset"):
            await env.reset()


def test_the_action_field_comes_from_the_schema():
    assert pick_action_field({"properties": {"message": {"type": "string"}, "metadata": {"type": "object"}},
                              "required": ["message"]}) == "message"
    with pytest.raises(UserError, match="cannot tell which"):
        pick_action_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}})


def test_observation_text():
    from agenttune_openenv.session import StepResult

    result = StepResult(observation={"prompt": "Guess.", "guesses_left": 3})
    assert observation_text(result, None) == "Guess."
    assert observation_text(result, "guesses_left") == "3"
    both = StepResult(observation={"a": "x", "b": "y"})
    assert observation_text(both, None) == '{"a": "x", "b": "y"}'
    with pytest.raises(UserError, match="observation_field"):
        observation_text(result, "board")


IMAGE = "registry.hf.space/openenv-echo-env:latest"

# A stand-in for the `docker` command (this machine has Docker's client but no daemon): `info` answers,
# `rm -f NAME` is logged, `run ... -p 127.0.0.1:PORT:8000 -e K=V IMAGE` logs its arguments and serves the
# echo test environment on PORT in the foreground, as `docker run` does with a container.
DOCKER_STAND_IN = """#!{python}
import os, sys
log = open({log!r}, "a")
print(" ".join(sys.argv[1:]), file=log, flush=True)
if sys.argv[1] == "run":
    port = sys.argv[sys.argv.index("-p") + 1].split(":")[1]
    os.chdir({tests!r})
    os.execv(sys.executable, [sys.executable, "-m", "uvicorn", "test_servers.echo_env:app", "--host", "127.0.0.1",
                              "--port", port, "--log-level", "warning"])
print("28.2.2")
"""


def test_an_image_without_a_usable_docker_is_refused_in_one_paragraph(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker here
    with pytest.raises(UserError, match="Docker is not usable here: there is no `docker` command.*openenv.url"):
        with openenv_server_for_run(OpenEnvSection(image=IMAGE), tmp_path):
            pass
    with pytest.raises(ValueError, match="one of openenv.app, openenv.command"):
        OpenEnvSection(app="a:app", command="python -m a")


def test_a_real_docker_client_without_a_daemon_is_refused_in_one_paragraph(tmp_path):
    import shutil
    import subprocess

    if shutil.which("docker") is None:
        pytest.skip("no docker client on this machine")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0:
        pytest.skip("this machine's Docker daemon answers")
    with pytest.raises(UserError, match=r"Docker is not usable here: `docker info` failed \(.+\)"):
        with openenv_server_for_run(OpenEnvSection(image=IMAGE), tmp_path):
            pass


def test_an_image_runs_with_docker_run_on_loopback_and_is_removed_at_the_end(tmp_path, monkeypatch):
    """The launcher's side of `image`: `docker run` with the port published on loopback and the env set,
    the server healthy and serving an episode, and the container removed when the run ends."""
    import os
    import sys
    from pathlib import Path

    bin_dir, log = tmp_path / "bin", tmp_path / "docker.log"
    bin_dir.mkdir()
    stand_in = bin_dir / "docker"
    tests = str(Path(__file__).parent)
    stand_in.write_text(DOCKER_STAND_IN.format(python=sys.executable, log=str(log), tests=tests), encoding="utf-8")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    section = OpenEnvSection(image=IMAGE, env={"ECHO_MODE": "loud"}, healthcheck_timeout=600)
    with openenv_server_for_run(section, tmp_path) as server:
        assert server is not None and server.container is not None

        async def one_episode() -> float:
            async with session(server.url) as env:
                await env.reset()
                return (await env.step({"message": "hello"})).reward or 0.0

        assert asyncio.run(one_episode()) == pytest.approx(0.5)  # the echo environment: 0.1 per character
    calls = log.read_text(encoding="utf-8").splitlines()
    run = next(call for call in calls if call.startswith("run "))
    assert run == (f"run --rm --name {server.container} -p 127.0.0.1:{server.port}:8000 -e ECHO_MODE=loud {IMAGE}")
    assert calls[0] == "info --format {{.ServerVersion}}"
    assert calls[-1] == f"rm -f {server.container}"  # after the server stopped
    assert server.process is not None and server.process.poll() is not None


def test_the_launchers_news_reaches_another_process(tmp_path):
    """What worker processes see: the news file named by $AGENTTUNE_OPENENV_NEWS, not this process's memory."""
    import os
    import subprocess
    import sys

    from agenttune_openenv.news import NEWS_VARIABLE, NewsFile

    news = NewsFile(tmp_path / "openenv_server_news.json")
    url = "http://127.0.0.1:9"
    probe = ("import sys; from agenttune_openenv.news import restarting, server_news; "
             "print(restarting(sys.argv[1]), repr(server_news(sys.argv[1])))")

    def seen_elsewhere() -> str:
        return subprocess.run([sys.executable, "-c", probe, url], env={**os.environ, NEWS_VARIABLE: str(news.path)},
                              capture_output=True, text=True, check=True, timeout=120).stdout.strip()

    news.note(url, "it exited with code -9; it is being started again", restarting=True)
    assert seen_elsewhere() == "True '; it exited with code -9; it is being started again'"
    news.note(url, None)
    assert seen_elsewhere() == "False ''"


async def test_a_session_handed_to_the_judge_from_a_workflow_process_keeps_its_rewards(echo_server):
    """With rollout.workflow_processes > 1 the session is pickled to reach the judge: its bookkeeping goes."""
    import pickle

    env = session(echo_server.url)
    await env.reset()
    await env.step({"message": "hello"})
    copy = pickle.loads(pickle.dumps(env))
    assert copy.opened and copy.rewards == pytest.approx([0.5]) and copy.steps == 1 and not copy.done
    await env.close()
    assert (await wait_for_live(echo_server, 0))["live"] == 0
