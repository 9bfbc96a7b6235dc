"""`agenttune data download` and `agenttune data preview` (real `datasets`, no network)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from test_core_readers import GSM8K_ROWS, write_jsonl


def test_download_without_network_explains_what_to_do(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    result = run_cli("data", "download", "openai/gsm8k", "--path", tmp_path / "data", "--name", "main")
    assert result.exit_code == 2, result.output
    assert "Cannot download dataset 'openai/gsm8k': the Hugging Face Hub is not reachable" in result.error
    assert "Traceback" not in result.output
    assert not (tmp_path / "data").exists()


def test_download_saves_every_split_as_parquet_and_previews_rows(run_cli, tmp_path):
    source = tmp_path / "gsm8k"  # a local dataset directory stands in for the hub
    write_jsonl(source / "train.jsonl", GSM8K_ROWS)
    write_jsonl(source / "test.jsonl", GSM8K_ROWS[:1])
    result = run_cli("data", "download", source, "--path", tmp_path / "data", "-n", "1")
    assert result.exit_code == 0, result.output
    saved = tmp_path / "data" / "gsm8k" / "default"
    files = sorted(path.name for path in saved.iterdir())
    assert files == ["test-00000-of-00001.parquet", "train-00000-of-00001.parquet"]
    assert pq.read_table(saved / "train-00000-of-00001.parquet").to_pylist() == GSM8K_ROWS
    assert "downloaded files" in result.stdout and str(saved / "train-00000-of-00001.parquet") in result.stdout
    assert "Natalia sold clips" in result.stdout  # the first row of train is previewed
    assert "Weng earns" not in result.stdout  # -n 1


def test_downloaded_directory_reads_with_both_readers_and_no_column_settings(run_cli, tmp_path, write_yaml):
    source = tmp_path / "gsm8k"
    write_jsonl(source / "train.jsonl", GSM8K_ROWS)
    assert run_cli("data", "download", source, "--path", tmp_path / "data").exit_code == 0
    saved = tmp_path / "data" / "gsm8k" / "default"
    for reader in ({"type": "file", "path": str(saved)}, {"type": "huggingface", "dataset_path": str(saved)}):
        result = run_cli("data", "preview", "--conf", write_yaml({"task_reader": reader}), "--json")
        assert result.exit_code == 0, result.output
        tasks = [json.loads(line) for line in result.stdout.splitlines()]
        assert [(task["query"], task["metadata"]["ground_truth"]) for task in tasks] == [
            (GSM8K_ROWS[0]["question"], "72"), (GSM8K_ROWS[1]["question"], "10")]


def test_preview_shows_tasks_as_the_reader_makes_them(run_cli, tmp_path, write_yaml):
    rows = [{"task_id": f"t{index}", "prompt": f"Question {index}?", "gold": str(index), "level": index % 2}
            for index in range(8)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "dev.jsonl", rows[:2])
    conf = write_yaml({"task_reader": {"type": "file", "path": str(tmp_path / "{split}.jsonl"),
                                       "query_column": "prompt", "ground_truth_column": "gold"}})
    table = run_cli("data", "preview", "--conf", conf)
    assert table.exit_code == 0, table.output
    assert "file reader, split 'train': first 5 tasks" in table.stdout
    assert "Question 4?" in table.stdout and "Question 5?" not in table.stdout
    assert '"level": 0' in table.stdout
    as_json = run_cli("data", "preview", "--conf", conf, "--split", "dev", "-n", "10", "--json")
    tasks = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [task["task_id"] for task in tasks] == ["t0", "t1"]
    assert tasks[1]["metadata"] == {"task_id": "t1", "gold": "1", "level": 1, "ground_truth": "1"}
    overridden = run_cli("data", "preview", "--conf", conf, "--json", "-n", "1", "task_reader.query_column=gold")
    assert json.loads(overridden.stdout)["query"] == "0"
