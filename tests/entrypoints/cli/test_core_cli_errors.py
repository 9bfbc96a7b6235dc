"""Every user mistake ends with one short paragraph on stderr, exit code 2 and no traceback;
`--debug` shows the traceback. (Mistakes in `train` are covered in test_core_train.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from agenttune.errors import UserError


def assert_one_paragraph(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.error.startswith("Error: "), result.error
    assert result.error.count("\n") == 1, f"more than one paragraph: {result.error!r}"
    assert ".." not in result.error.replace("...", "") and "?." not in result.error
    for fragment in fragments:
        assert fragment in result.error, result.error


def test_missing_config_file(run_cli, tmp_path):
    result = run_cli("config", "show", "--conf", tmp_path / "missing.yaml")
    assert_one_paragraph(result, "missing.yaml' does not exist", "--conf")


def test_yaml_syntax_error_names_line_and_column(run_cli, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  path: x\n   dtype: auto\n", encoding="utf-8")
    result = run_cli("config", "show", f"--conf={path}")
    assert_one_paragraph(result, "broken.yaml' is not valid YAML at line 3, column 9")


def test_unknown_key_with_did_you_mean(run_cli, write_yaml):
    result = run_cli("config", "show", "--conf", write_yaml({"trainer": {"learning_rat": 0.1}}))
    assert_one_paragraph(result, "unknown key 'trainer.learning_rat'; did you mean 'trainer.learning_rate'?")


def test_wrong_type(run_cli, write_yaml):
    result = run_cli("config", "show", "--conf", write_yaml({"data": {"train_batch_size": "eight"}}))
    assert_one_paragraph(result, "data.train_batch_size = 'eight' is invalid: Input should be a valid integer")


def test_unknown_backbone_lists_the_available_ones(run_cli, register_plugin):
    from agenttune.components.backbone import Backbone

    class Local(Backbone):
        name = "only-one"

    register_plugin(backbones=[Local])
    result = run_cli("config", "show", "--backbone", "nonexistent")
    assert_one_paragraph(result, "--backbone: unknown backbone 'nonexistent'. Available:", "only-one")


def test_dataset_column_missing(run_cli, write_yaml, tmp_path):
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"prompt": "hi"}\n', encoding="utf-8")
    conf = write_yaml({"task_reader": {"type": "file", "path": str(data)}})
    result = run_cli("data", "preview", "--conf", conf)
    assert_one_paragraph(result, "has no column 'query'", "Its columns are: prompt", "task_reader.query_column")


def test_empty_split(run_cli, write_yaml, tmp_path):
    (tmp_path / "train.jsonl").write_text("\n", encoding="utf-8")
    conf = write_yaml({"task_reader": {"type": "file", "path": str(tmp_path / "{split}.jsonl")}})
    result = run_cli("data", "preview", "--conf", conf)
    assert_one_paragraph(result, "has no rows for split 'train'")


def test_bad_reader_option(run_cli, write_yaml):
    conf = write_yaml({"task_reader": {"type": "huggingface", "datset_path": "x"}})
    result = run_cli("data", "preview", "--conf", conf)
    assert_one_paragraph(result, "unknown key 'task_reader.datset_path'; did you mean 'task_reader.dataset_path'?")


def test_usage_errors_keep_clicks_message_and_exit_code(run_cli):
    result = run_cli("train")
    assert result.exit_code == 2
    assert "Missing option '--conf'" in result.stderr
    assert "Traceback" not in result.output


def test_debug_raises_the_original_error(run_cli, tmp_path):
    from agenttune.entrypoints.cli.main import main

    with pytest.raises(UserError, match="does not exist"):
        main(["--debug", "config", "show", "--conf", str(tmp_path / "missing.yaml")])


@pytest.mark.slow
def test_the_installed_command_prints_one_line_and_debug_a_traceback(tmp_path):
    command = [sys.executable, "-m", "agenttune", "config", "show", "--conf", str(tmp_path / "missing.yaml")]
    plain = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 2
    errors = [line for line in plain.stderr.splitlines() if not line.startswith("Warning: ")]
    assert len(errors) == 1 and errors[0].startswith("Error: Config file"), plain.stderr
    debug = subprocess.run([*command[:3], "--debug", *command[3:]], capture_output=True, text=True, timeout=60)
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr
    assert "agenttune.errors.UserError: Config file" in debug.stderr
