"""tinker-cookbook 0.6.1's own RL and supervised loops against agenttune's Tinker server (the tiny model,
on a loopback port).

Run by the `tinker_cookbook` nox session, which installs tinker-cookbook; the `tests` and `fast` sessions
pass `--ignore` for this folder. In an environment without tinker-cookbook (a bare `pytest tests`), the
folder is not collected at all (below), so it leaves neither a failure nor a skip behind.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

if importlib.util.find_spec("tinker_cookbook") is None or importlib.util.find_spec("tinker") is None:
    collect_ignore_glob = ["test_*.py"]

MODEL = "tiny://default"
API_KEY = "tml-agenttune-cookbook-tests"


@pytest.fixture(scope="module")
def cookbook_server(tmp_path_factory) -> Iterator[str]:
    """The base URL of a Tinker server on the tiny model, with the cookbook set up to use it offline."""
    from agenttune.entrypoints.tinker.app import build_app
    from agenttune.entrypoints.tinker.server import build_state
    from agenttune.testing import tiny_tokenizer
    from agenttune.testing.cookbook_rl import offline_cookbook
    from agenttune.testing.loopback import serve_app

    state = build_state(MODEL, tmp_path_factory.mktemp("tinker-state"), device="cpu", poll_s=2.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_TELEMETRY", "0")
        patch.setenv("TINKER_API_KEY", API_KEY)
        # `tiny://default` is agenttune's name, not a hub id: the cookbook's tokenizer registry maps it to the
        # tiny model's tokenizer, loaded from its local directory (what the server's get_info names).
        try:
            with offline_cookbook(MODEL, tiny_tokenizer), serve_app(build_app(state)) as base_url:
                yield base_url
        finally:
            state.futures.close()

