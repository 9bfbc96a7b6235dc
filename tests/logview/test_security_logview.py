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


# -- files read whole, and the connections themselves (issue 35) ---------------------------------------------
def metrics_answer(tmp_path: Path, make_metrics) -> tuple[int, dict]:
    """The viewer's /api/metrics answer for a run whose metrics.jsonl `make_metrics(path)` made."""
    root = tmp_path / "root"
    run = write_run(root / "run", steps=1, validation=False)
    (run / "metrics.jsonl").unlink()
    make_metrics(run / "metrics.jsonl")
    with viewer(root) as (_, client):
        response = client.get("/api/metrics", params={"run": "run"})
        return response.status_code, response.json()


def test_a_metrics_link_out_of_the_root_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps({"step": 1, "reward/mean": 0.5, "note": CANARY}) + "\n")
    status, answer = metrics_answer(tmp_path, lambda path: path.symlink_to(outside))
    assert status == 403 and "outside" in answer["error"] and CANARY not in json.dumps(answer)


def test_a_metrics_link_to_a_device_is_refused_not_read(tmp_path):
    status, answer = metrics_answer(tmp_path, lambda path: path.symlink_to("/dev/zero"))
    assert status == 403, answer


def test_a_metrics_fifo_inside_the_root_is_refused_not_waited_on(tmp_path):
    import os

    status, answer = metrics_answer(tmp_path, lambda path: os.mkfifo(path))
    assert status == 403 and "not a regular file" in answer["error"]


def test_a_metrics_link_inside_the_root_is_read(tmp_path):
    """The control: a link that stays inside the root is followed."""
    def link_inside(path: Path) -> None:
        (path.parent / "real-metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
        path.symlink_to(path.parent / "real-metrics.jsonl")

    status, answer = metrics_answer(tmp_path, link_inside)
    assert status == 200 and answer["steps"] == 1


def test_an_oversized_metrics_file_is_refused(tmp_path, monkeypatch):
    from agenttune.logview import run_metrics

    monkeypatch.setattr(run_metrics, "MAX_METRICS_BYTES", 1000)
    lines = "".join(json.dumps({"step": step, "reward/mean": 0.1}) + "\n" for step in range(100))
    status, answer = metrics_answer(tmp_path, lambda path: path.write_text(lines))
    assert status == 413 and "larger than" in answer["error"]


def test_pages_of_other_sites_are_refused(served):
    _, _, client = served
    refused = client.get("/api/runs", headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden_origin"
    assert client.get("/api/runs", headers={"Origin": str(client.base_url).rstrip("/")}).status_code == 200


def test_idle_connections_and_connections_beyond_the_cap_are_closed(tmp_path):
    import socket

    from agenttune.web import ServerLimits

    root = write_run(tmp_path / "run", steps=1, validation=False)
    with viewer(root, ServerLimits(request_timeout_s=0.5, max_connections=3)) as (url, client):
        port = httpx.URL(url).port
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            assert extra.recv(65536).startswith(b"HTTP/1.1 503")
        for sock in idle:  # each is answered 408 and closed by the server
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408")
            sock.close()
        assert client.get("/api/runs").status_code == 200
