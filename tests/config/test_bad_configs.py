"""The bad-configuration corpus (tests/config/bad_configs/): every malformed config is refused the same way.

Each `*.yaml` there but `valid.yaml` breaks one thing: YAML syntax, unknown keys, wrong types,
impossible numbers, unknown plugins, bad code references, missing files, bad overrides and
environment variables. `agenttune train --conf FILE` (run from that directory, as a user would) must
exit with code 2 and print one paragraph on stderr that says what the `# expect:` header lines say,
without a traceback; `agenttune config check` and `config show` must say the same before any run starts.
`valid.yaml` is the control: the same directory and commands, and the run works.

Header lines a corpus file may carry:
    # expect: TEXT        the error paragraph must contain TEXT (one or more lines)
    # args: ARG ...       extra command-line arguments (overrides)
    # env: NAME=VALUE     an environment variable set for the run
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "bad_configs"
BAD = sorted(path for path in CORPUS.glob("*.yaml") if path.name != "valid.yaml")


@dataclass
class Case:
    path: Path
    expect: list[str]
    args: list[str]
    env: dict[str, str]

    @classmethod
    def read(cls, path: Path) -> Case:
        expect, args, env = [], [], {}
        for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
            if not line.startswith("# "):
                continue
            key, _, value = line[2:].partition(": ")
            if key == "expect":
                expect.append(value)
            elif key == "args":
                args += shlex.split(value)
            elif key == "env":
                name, _, setting = value.partition("=")
                env[name] = setting
        return cls(path, expect, args, env)


def paragraph_problems(stderr: str) -> list[str]:
    """Why `stderr` does not end in one clear error paragraph (empty: it does).

    Errors found once the run has started come after its log lines ("run started"); those may stay.
    """
    problems = []
    if "Traceback" in stderr or '  File "' in stderr:
        problems.append("shows a traceback")
    at = stderr.find("Error:")
    if at < 0 or (at > 0 and stderr[at - 1] != "\n"):
        return [*problems, "has no line starting with 'Error:'"]
    paragraph = stderr[at:].strip()
    if "\n\n" in paragraph:
        problems.append("is more than one paragraph")
    if len(paragraph) > 1200:
        problems.append(f"is {len(paragraph)} characters long")
    return problems


def test_the_corpus_is_large_enough_and_every_file_says_what_to_expect():
    assert len(BAD) >= 30
    for path in BAD:
        assert Case.read(path).expect, f"{path.name} has no '# expect:' line"


@pytest.fixture
def in_corpus(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(CORPUS)  # relative data paths resolve against the current directory, as for users
    return CORPUS


def test_the_valid_control_config_runs(run_cli, in_corpus, tmp_path):
    result = run_cli("train", "--conf", "valid.yaml", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert metrics["episodes"] == 4 and metrics["failure_rate"] == 0.0 and metrics["reward/mean"] == 1.0


def test_the_valid_control_config_passes_config_check_and_show(run_cli, in_corpus):
    checked = run_cli("config", "check", "--conf", "valid.yaml")
    assert checked.exit_code == 0 and "valid.yaml: ok" in checked.stdout, checked.output
    shown = run_cli("config", "show", "--conf", "valid.yaml")
    assert shown.exit_code == 0 and "workflow: badcfg_workflow:EchoAgent" in shown.stdout, shown.output


COMMANDS = {"train": ["train"], "config-check": ["config", "check"], "config-show": ["config", "show"]}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("path", BAD, ids=[path.stem for path in BAD])
def test_a_bad_config_is_one_clear_paragraph_and_exit_code_2(run_cli, in_corpus, tmp_path, monkeypatch, path,
                                                             command):
    case = Case.read(path)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    run_dir = ["--run-dir", tmp_path / "run"] if command == "train" else []
    result = run_cli(*COMMANDS[command], "--conf", path.name, *run_dir, *case.args)
    assert result.exit_code == 2, f"exit code {result.exit_code}:\n{result.output}"
    assert not paragraph_problems(result.error), f"{paragraph_problems(result.error)}:\n{result.error}"
    message = " ".join(result.error[result.error.find("Error:"):].split())  # rich wraps lines; compare words
    for expected in case.expect:
        assert expected in message, f"{expected!r} not in:\n{result.error}"
    assert result.stdout.strip() == "", f"stdout should be empty:\n{result.stdout}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["yaml_unclosed_brace", "workflow_module_raises", "missing_data_file"])
def test_the_installed_command_says_the_same_without_a_traceback(name, tmp_path):
    """Through the real console entry point in a fresh interpreter (what users run)."""
    command = [sys.executable, "-m", "agenttune", "train", "--conf", f"{name}.yaml", "--run-dir", str(tmp_path / "run")]
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGENTTUNE_")}
    result = subprocess.run(command, cwd=CORPUS, capture_output=True, text=True, timeout=120, env={**env, "COLUMNS": "200"})
    assert result.returncode == 2, result.stderr
    assert not paragraph_problems(result.stderr), result.stderr
    for expected in Case.read(CORPUS / f"{name}.yaml").expect:
        assert expected in " ".join(result.stderr.split())
