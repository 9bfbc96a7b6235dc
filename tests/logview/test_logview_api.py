"""The log viewer's HTTP API, on a real server on loopback, over rollout logs the real writer wrote."""

from __future__ import annotations

import json

import pytest
from logview_runs import IMG, SCRIPT, step_episodes, viewer, write_run, write_step

from agenttune.rollout.log import RolloutLog, read_records
from agenttune.testing import tiny_tokenizer

TRAIN_1 = "proj/exp/run-a/rollouts/step_000001_train.jsonl"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project directory: two runs (one still without metrics), and clutter that is not a run."""
    root = tmp_path_factory.mktemp("project")
    write_run(root / "proj" / "exp" / "run-a", steps=2)
    write_run(root / "proj" / "exp" / "run-b", steps=1, validation=False)
    (root / "proj" / "exp" / "run-b" / "metrics.jsonl").unlink()
    (root / ".hidden" / "rollouts").mkdir(parents=True)  # hidden folders are not searched
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("not a run")
    return root


@pytest.fixture(scope="module")
def api(project):
    with viewer(project) as (_, client):
        yield client


def test_runs_lists_each_run_with_its_steps(api, project):
    data = api.get("/api/runs").json()
    assert data["root"] == str(project.resolve())
    runs = {run["id"]: run for run in data["runs"]}
    assert set(runs) == {"proj/exp/run-a", "proj/exp/run-b"}
    assert runs["proj/exp/run-a"]["has_metrics"] is True
    assert runs["proj/exp/run-b"]["has_metrics"] is False
    steps = [(step["step"], step["split"]) for step in runs["proj/exp/run-a"]["steps"]]
    assert steps == [(1, "train"), (1, "validation"), (2, "train"), (2, "validation")]
    first = runs["proj/exp/run-a"]["steps"][0]
    assert first["id"] == TRAIN_1
    assert first["size"] == (project / TRAIN_1).stat().st_size


def test_episode_table_has_the_summary_fields_and_no_token_arrays(api, project):
    response = api.get("/api/episodes", params={"file": TRAIN_1})
    data = response.json()
    records = list(read_records(project / TRAIN_1))
    assert (data["total"], data["matched"]) == (6, 6)
    assert data["statuses"] == {"ok": 5, "timeout": 1}
    for row, record in zip(data["episodes"], records, strict=True):
        assert row["episode_id"] == record.episode_id
        assert row["task_id"] == record.task.task_id
        assert (row["reward"], row["success"], row["status"]) == (record.reward, record.success, record.status.value)
        assert row["turns"] == record.metrics["calls"] == 2
        assert row["repeat_index"] == record.repeat_index
        assert row["query"] == record.task.query
    assert data["episodes"][3]["error"].startswith("TimeoutError")
    for key in ("prompt_ids", "response_ids", "logprobs", "loss_mask", "prompt_tokens"):
        assert key not in response.text


def test_filters_sorting_and_paging(api):
    def rows(**params):
        return api.get("/api/episodes", params={"file": TRAIN_1, **params}).json()

    assert [row["status"] for row in rows(status="timeout")["episodes"]] == ["timeout"]
    assert [row["index"] for row in rows(status="failed")["episodes"]] == [3]
    assert all(row["success"] for row in rows(success="true")["episodes"])
    assert rows(success="true")["matched"] == 3  # numbers 0, 2, 4 answer right
    assert [row["reward"] for row in rows(min_reward="0.5")["episodes"]] == [1.0, 1.0, 1.0]
    assert rows(max_reward="0.5", min_reward="0")["matched"] == 3

    by_reward = rows(sort="reward", order="desc")["episodes"]
    assert [row["reward"] for row in by_reward] == sorted((row["reward"] for row in by_reward), reverse=True)
    assert [row["index"] for row in rows(order="desc")["episodes"]] == [5, 4, 3, 2, 1, 0]

    page = rows(limit=2, offset=2)
    assert (page["matched"], page["offset"]) == (6, 2)
    assert [row["index"] for row in page["episodes"]] == [2, 3]


def test_text_search_reads_conversations_not_token_arrays(api, project):
    def matched(text):
        return [row["index"] for row in api.get("/api/episodes", params={"file": TRAIN_1, "q": text}).json()["episodes"]]

    assert matched("What is 4 * 7") == [4]
    assert matched("WHAT IS 4 * 7") == [4]  # case-insensitive
    assert matched("<script>") == [5]
    assert matched('onerror="window') == [5]  # quotes are searched as written, not as JSON escapes
    assert matched("the episode ran past") == [3]  # errors are searched too
    assert matched("no such words anywhere") == []
    # An id that only occurs in the token arrays (never in the text) matches nothing.
    record = next(read_records(project / TRAIN_1))
    text = json.dumps(record.model_dump(exclude={"samples"}))
    only_in_ids = next(str(token) for token in record.samples[0].prompt_ids
                       if len(str(token)) == 3 and str(token) not in text)
    assert matched(only_in_ids) == []


def test_episode_is_the_full_record_as_written(api, project):
    records = list(read_records(project / TRAIN_1))
    response = api.get("/api/episode", params={"file": TRAIN_1, "index": 5})
    assert response.headers["content-type"] == "application/json"
    record = response.json()
    assert record == json.loads(records[5].model_dump_json())
    sample = record["samples"][0]
    assert len(sample["response_tokens"]) == len(sample["response_ids"]) == len(sample["logprobs"])
    # Model text comes back as JSON data, verbatim, for the page to show as text.
    assert SCRIPT in record["messages"][-1]["content"] and IMG in record["messages"][-1]["content"]


def test_metrics_give_reward_success_and_validation_accuracy_per_step(api):
    charts = {chart["title"]: chart for chart in api.get("/api/metrics", params={"run": "proj/exp/run-a"}).json()["charts"]}
    series = {line["key"]: line["points"] for chart in charts.values() for line in chart["series"]}
    assert [step for step, _ in series["reward/mean"]] == [1, 2]
    assert series["success_rate"] == [[1, 0.5], [2, 0.5]]
    assert series["val/success_rate"] == [[1, 0.5], [2, 0.5]]  # validation episodes 0 (right) and 1 (wrong)
    assert charts["Success / accuracy"]["fraction"] is True
    # A run without metrics.jsonl yet has empty charts, not an error.
    empty = api.get("/api/metrics", params={"run": "proj/exp/run-b"}).json()
    assert all(not line["points"] for chart in empty["charts"] for line in chart["series"])


def test_a_growing_run_shows_new_steps_episodes_and_metrics(tmp_path):
    run = write_run(tmp_path / "run", steps=1, validation=False)
    with viewer(run) as (_, api):
        file = "rollouts/step_000001_train.jsonl"
        assert api.get("/api/episodes", params={"file": file}).json()["total"] == 6
        write_step(run, 2, validation=False)
        RolloutLog(run / "rollouts").write(1, "train", step_episodes(1, 3), tiny_tokenizer())  # appended
        assert api.get("/api/episodes", params={"file": file}).json()["total"] == 9
        [only] = api.get("/api/runs").json()["runs"]
        assert [step["step"] for step in only["steps"]] == [1, 2]
        charts = api.get("/api/metrics", params={"run": "."}).json()["charts"]
        assert [step for step, _ in charts[0]["series"][0]["points"]] == [1, 2]


def test_a_run_directory_a_rollouts_directory_and_a_single_file_can_be_served(tmp_path):
    run = write_run(tmp_path / "run", steps=1)
    with viewer(run) as (_, api):
        [entry] = api.get("/api/runs").json()["runs"]
        assert (entry["id"], entry["has_metrics"]) == (".", True)
        assert api.get("/api/episodes", params={"file": entry["steps"][0]["id"]}).json()["total"] == 6
    with viewer(run / "rollouts") as (_, api):
        [entry] = api.get("/api/runs").json()["runs"]
        assert [step["id"] for step in entry["steps"]] == ["step_000001_train.jsonl", "step_000001_validation.jsonl"]
        assert api.get("/api/episodes", params={"file": "step_000001_validation.jsonl"}).json()["total"] == 2
    single = run / "rollouts" / "step_000001_train.jsonl"
    with viewer(single) as (_, api):
        [entry] = api.get("/api/runs").json()["runs"]
        assert [step["id"] for step in entry["steps"]] == [single.name]
        assert api.get("/api/episode", params={"file": single.name, "index": 0}).json()["step"] == 1
        refused = api.get("/api/episodes", params={"file": "step_000001_validation.jsonl"})
        assert refused.status_code == 403  # its neighbour is not what this viewer serves


def test_a_root_that_does_not_exist_yet_waits_for_the_run(tmp_path):
    with viewer(tmp_path / "not-yet") as (_, api):
        data = api.get("/api/runs").json()
        assert (data["exists"], data["runs"]) == (False, [])
        write_run(tmp_path / "not-yet", steps=1)
        assert [run["id"] for run in api.get("/api/runs").json()["runs"]] == ["."]


@pytest.mark.parametrize("name", [
    "../outside/rollouts/step_000001_train.jsonl",
    "proj/../../outside/rollouts/step_000001_train.jsonl",
    "%OUTSIDE%/rollouts/step_000001_train.jsonl",  # an absolute path
    "proj/exp/run-a/rollouts/../../../../../outside/rollouts/step_000001_train.jsonl",
])
def test_paths_outside_the_root_are_refused(tmp_path, name):
    outside = write_run(tmp_path / "outside", steps=1, validation=False)
    root = write_run(tmp_path / "root" / "proj" / "exp" / "run-a", steps=1, validation=False).parents[2]
    name = name.replace("%OUTSIDE%", str(outside))
    with viewer(root) as (_, api):
        for path in ("/api/episodes", "/api/episode"):
            response = api.get(path, params={"file": name, "index": 0})
            assert response.status_code == 403, response.text
            assert "outside the directory" in response.json()["error"]
        assert api.get("/api/metrics", params={"run": "../outside"}).status_code == 403
        assert api.get("/api/metrics", params={"run": str(outside)}).status_code == 403


def test_symlinks_out_of_the_root_and_other_files_are_refused(tmp_path):
    outside = write_run(tmp_path / "outside", steps=1, validation=False)
    run = write_run(tmp_path / "root" / "run", steps=1, validation=False)
    link = run / "rollouts" / "step_000009_train.jsonl"
    link.symlink_to(outside / "rollouts" / "step_000001_train.jsonl")
    (run / "linked-run").symlink_to(outside, target_is_directory=True)
    with viewer(tmp_path / "root") as (_, api):
        listed = [step["id"] for run in api.get("/api/runs").json()["runs"] for step in run["steps"]]
        assert listed == ["run/rollouts/step_000001_train.jsonl"]  # the link is not offered
        assert api.get("/api/episodes", params={"file": "run/rollouts/step_000009_train.jsonl"}).status_code == 403
        assert api.get("/api/metrics", params={"run": "run/linked-run"}).status_code == 403
        for other in ("run/config.yaml", "run/metrics.jsonl", "run/log.jsonl"):
            (tmp_path / "root" / other).write_text("{}\n")
            assert api.get("/api/episodes", params={"file": other}).status_code == 403
        # The static files are served from the package only.
        for path in ("/static/../app.py", "/static/..%2f..%2fapp.py", "/static/%2e%2e/app.py"):
            response = api.get(path)
            assert response.status_code == 404, path
            assert "create_app" not in response.text


def test_requests_for_other_host_names_are_refused(api):
    """A web page cannot read a loopback viewer by pointing its own host name at 127.0.0.1."""
    assert api.get("/api/runs", headers={"Host": "evil.example"}).status_code == 421
    assert api.get("/api/runs", headers={"Host": "evil.example:8181"}).status_code == 421
    assert api.get("/api/runs", headers={"Host": "localhost:8181"}).status_code == 200


def test_page_and_api_forbid_inline_scripts(api):
    page = api.get("/")
    assert page.status_code == 200 and '<script src="/static/app.js"' in page.text
    for response in (page, api.get("/api/runs"), api.get("/static/app.js")):
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert response.headers["x-content-type-options"] == "nosniff"
    script = api.get("/static/app.js").text
    assert "innerHTML" not in script.replace("Never innerHTML", "")


def test_bad_requests_get_clear_errors(api):
    def error(path, **params):
        response = api.get(path, params=params)
        return response.status_code, response.json()["error"]

    status, message = error("/api/episodes", file=TRAIN_1, sort="bogus")
    assert status == 400 and "Cannot sort by 'bogus'" in message
    status, message = error("/api/episodes", file=TRAIN_1, limit="many")
    assert status == 400 and "limit must be a whole number" in message
    status, message = error("/api/episodes", file=TRAIN_1, min_reward="high")
    assert status == 400 and "min_reward must be a number" in message
    assert error("/api/episodes") == (400, "The query parameter 'file' is required.")
    status, message = error("/api/episode", file=TRAIN_1, index=99)
    assert status == 404 and "No episode 99 in this file (6 episodes)" in message
    status, _ = error("/api/episodes", file="proj/exp/run-a/rollouts/step_000042_train.jsonl")
    assert status == 404


def test_each_sample_names_its_policy_and_the_table_filters_by_policy(tmp_path):
    """Several policies in one run: episodes where a solver (policy `solver`) and a checker (policy `checker`,
    or the base model in odd episodes) took turns. The writer records each sample's policy and the episode's
    policies; the table shows them, counts them and filters by them; the full record keeps each sample's."""
    episodes = step_episodes(1, count=4)
    for number, written in enumerate(episodes):
        [solver] = written.samples
        checker = solver.model_copy(update={"agent": "checker", "policy": "checker" if number % 2 == 0 else None})
        written.samples = [solver.model_copy(update={"agent": "solver", "policy": "solver"}), checker]
    RolloutLog(tmp_path / "run" / "rollouts").write(1, "train", episodes, tiny_tokenizer())
    file = "run/rollouts/step_000001_train.jsonl"
    with viewer(tmp_path) as (_, api):
        def rows(**params):
            return api.get("/api/episodes", params={"file": file, **params}).json()

        everything = rows()
        assert [row["policies"] for row in everything["episodes"]] == [["checker", "solver"], ["solver"]] * 2
        assert everything["policies"] == {"solver": 4, "checker": 2}
        assert [row["index"] for row in rows(policy="checker")["episodes"]] == [0, 2]
        assert rows(policy="solver")["matched"] == 4
        assert rows(policy="critic")["matched"] == 0
        record = api.get("/api/episode", params={"file": file, "index": 1}).json()
        assert [(sample["agent"], sample["policy"]) for sample in record["samples"]] == [("solver", "solver"),
                                                                                         ("checker", None)]
    one_policy = tmp_path / "single"
    write_run(one_policy, steps=1, validation=False)
    with viewer(one_policy) as (_, api):
        data = api.get("/api/episodes", params={"file": "rollouts/step_000001_train.jsonl"}).json()
        assert data["policies"] == {} and all(row["policies"] == [] for row in data["episodes"])
