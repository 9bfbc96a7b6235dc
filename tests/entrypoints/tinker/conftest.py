"""A Tinker-compatible server on the tiny model, on a loopback port, for the real `tinker` SDK."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tinker")  # the `tinker` extra (CI installs it)

MODEL = "tiny://default"
API_KEY = "tml-agenttune-tests"


@pytest.fixture(scope="module", autouse=True)
def _sdk_environment():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_TELEMETRY", "0")  # (the server accepts telemetry, but tests need none)
        patch.setenv("TINKER_API_KEY", API_KEY)
        yield


@contextlib.contextmanager
def tinker_server(state_dir: Path, *, poll_s: float = 2.0, **options) -> Iterator[tuple[str, object]]:
    """(base URL, server state) of a server on `state_dir`, stopped when the block ends. `poll_s`: how long
    retrieve_future holds a pending request before answering 408 try_again."""
    from agenttune.entrypoints.tinker.app import build_app
    from agenttune.entrypoints.tinker.server import build_state
    from agenttune.testing.loopback import serve_app

    state = build_state(MODEL, state_dir, device="cpu", poll_s=poll_s)
    try:
        with serve_app(build_app(state, **options)) as base_url:
            yield base_url, state
    finally:
        state.futures.close()


@pytest.fixture(scope="session")
def start_server():
    """`with start_server(state_dir, **build_app_options) as (base_url, state)`: another server."""
    return tinker_server


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tinker-state")


@pytest.fixture(scope="module")
def server(state_dir) -> Iterator[tuple[str, object]]:
    with tinker_server(state_dir) as served:
        yield served


@pytest.fixture(scope="module")
def service(server):
    import tinker

    base_url, _ = server
    service = tinker.ServiceClient(base_url=base_url, api_key=API_KEY)
    yield service
    service.close("success").result()


@pytest.fixture(scope="module")
def tokenizer(server):
    return server[1].host.tokenizer
