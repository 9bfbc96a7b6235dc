"""The log viewer never serves anything from outside its root, whatever path it is asked for.

tests/logview/test_logview_api.py checks the known tricks one by one (../, absolute paths, symlinks, other
files). Here hypothesis builds paths out of the same ingredients and worse (encoded dots, NUL bytes,
backslashes, doubled slashes, Unicode look-alikes, very long names) against a real viewer. A canary
run sits beside the root: its text must never appear in an answer, and no answer may be a 5xx.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from logview_runs import viewer, write_run

CANARY = "CANARY-outside-the-root-7f3a"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Path, Path, httpx.Client]]:
    base = tmp_path_factory.mktemp("logview-security")
    root = write_run(base / "root" / "proj" / "run", steps=1, validation=False).parents[1]
    outside = write_run(base / "outside", steps=1, validation=False)
    log = outside / "rollouts" / "step_000001_train.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({**record, "messages": [{"role": "user", "content": CANARY}]}) + "\n"
                           for record in records))
    (base / "secret.txt").write_text(CANARY)
    with viewer(root) as (_, client):
        yield root, outside, client


segments = st.sampled_from(["..", ".", "", "proj", "run", "rollouts", "step_000001_train.jsonl", "outside",
                            "%2e%2e", "%2E%2E", "..%2f", "%2f", "\\..\\", "..\\..", "\x00", "%00", "\u2024\u2024",
                            "．．", "secret.txt", "~", "$HOME", "a" * 300])
paths = st.lists(segments, max_size=10).map("/".join) | st.text(max_size=60)


def refused_or_inside(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:300]
    assert CANARY not in response.text
    if response.status_code != 200:
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["error"]


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=paths, absolute=st.booleans(), index=st.integers(-3, 10) | st.text(max_size=5))
@example(path="outside/rollouts/step_000001_train.jsonl", absolute=True, index=0)
@example(path="../outside/rollouts/step_000001_train.jsonl", absolute=False, index=0)
@example(path="../../secret.txt", absolute=False, index=0)
@example(path="a" * 300, absolute=False, index=0)  # a name too long for the file system was a 500
def test_no_path_reaches_outside_the_root(served, path, absolute, index):
    root, outside, client = served
    if absolute:
        path = f"{root.parent}/{path}"
    refused_or_inside(client.get("/api/episodes", params={"file": path}))
    refused_or_inside(client.get("/api/episode", params={"file": path, "index": index}))
    refused_or_inside(client.get("/api/metrics", params={"run": path}))


def raw_get(client: httpx.Client, path: str) -> tuple[int, str]:
    """GET `path` exactly as given (httpx would normalise or refuse some of these paths)."""
    connection = http.client.HTTPConnection(client.base_url.host, client.base_url.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", errors="replace")
    finally:
        connection.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(segments.filter(lambda segment: "\x00" not in segment), max_size=8).map("/".join))
@example(path="//..")
def test_raw_url_paths_serve_only_the_app(served, path):
    _, _, client = served
    for prefix in ("/", "/static/", "/api/"):
        status, text = raw_get(client, quote(prefix + path, safe="/%~$"))
        assert status < 500 and CANARY not in text and "def create_app" not in text, (status, prefix + path)


def test_the_canary_is_really_there_to_find(served):
    """The control: the same viewer pointed at the outside run does show the canary."""
    _, outside, _ = served
    with viewer(outside) as (_, client):
        response = client.get("/api/episode", params={"file": "rollouts/step_000001_train.jsonl", "index": 0})
        assert response.status_code == 200 and CANARY in response.text
