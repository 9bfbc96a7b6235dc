"""The commands of this plugin's README, run as written on this CPU machine up to where a GPU is needed.

The nox `verl` session installs the README's GPU line without its `[gpu]` extra (`-e . -e plugins/verl
-e plugins/agentscope -e plugins/judges/gsm8k`, with verl's CPU pins), so the math agent's `config show`
runs against the AgentScope line a new user gets. The CPU walkthrough's commands run in a copy of the
quickstart's folder (its data is written there, not into the checkout), with the tiny model's directory in
the test's own folder instead of `/tmp/tiny`; its `train` commands go through `config check`, which
resolves everything a run needs without starting it (test_cpu_run.py trains through verl for real).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Each command imports torch and verl (~20 s of CPU each); generous limits for a loaded machine.
pytestmark = pytest.mark.timeout(900)

pytest.importorskip("agenttune_agentscope", reason="the math agent's commands need the AgentScope plugin")
pytest.importorskip("agenttune_gsm8k", reason="the math agent's judge is the gsm8k plugin's")

PLUGIN = Path(__file__).parents[1]
REPO = PLUGIN.parents[1]
AGENTTUNE = str(Path(sys.executable).with_name("agenttune"))
MATH_CONF = "examples/math_agent/math_agent.yaml"
QUICKSTART_CONF = "examples/quickstart/quickstart.yaml"


def readme_commands() -> list[list[str]]:
    """The README's shell commands as argument lists: continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (PLUGIN / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]


def readme_command(*prefix: str) -> list[str]:
    """The README commands that start with `prefix`: a test fails when the README drops or changes them."""
    found = [argv for argv in readme_commands() if argv[:len(prefix)] == list(prefix)]
    assert found, f"no README command starts with {' '.join(prefix)!r}"
    return found[0]


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    program = AGENTTUNE if argv[0] == "agenttune" else sys.executable if argv[0] == "python" else argv[0]
    # Wide: rich folds no error paragraph in two. Offline: no hub calls, no retry waits.
    environment = {**os.environ, "COLUMNS": "500", "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([program, *argv[1:]], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=600)


def paragraph(result: subprocess.CompletedProcess[str]) -> str:
    return " ".join((result.stdout + result.stderr).split())


def test_math_agent_config_show_stops_at_the_hub_model_in_one_paragraph(tmp_path):
    """As written, on a machine that cannot reach the hub: the workflow (on the installed AgentScope line),
    reader and judge resolve, and it stops at `Qwen/Qwen2.5-7B-Instruct` in one paragraph."""
    argv = readme_command("agenttune", "config", "show", "--conf", MATH_CONF, "--backbone", "verl")
    result = run(argv, REPO, HF_HUB_CACHE=str(tmp_path))

    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in paragraph(result)
    assert "Error: model.path: cannot read the model's config from 'Qwen/Qwen2.5-7B-Instruct'" in paragraph(result)


def test_math_agent_config_show_prints_the_verl_config_for_a_local_model(tmp_path):
    """The same command with the model a GPU user downloaded (here the tiny one): the verl config it will run."""
    model = tmp_path / "model"
    assert run(["agenttune", "model", "init-tiny", str(model)], REPO).returncode == 0
    argv = readme_command("agenttune", "config", "show", "--conf", MATH_CONF, "--backbone", "verl")
    result = run([*argv, f"model.path={model}"], REPO)

    assert result.returncode == 0, result.stdout + result.stderr
    shown = result.stdout
    assert "workflow: math_agent:MathAgentWorkflow" in shown and "backbone: verl" in shown
    assert "n_gpus_per_node: 8" in shown  # the example's GPU settings reach the verl config
    assert str(model) in shown


@pytest.fixture
def quickstart_copy(tmp_path: Path) -> Path:
    """A folder laid out like the repository root for the quickstart's files."""
    shutil.copytree(REPO / "examples" / "quickstart", tmp_path / "examples" / "quickstart",
                    ignore=shutil.ignore_patterns("data", "__pycache__"))
    return tmp_path


def test_the_cpu_walkthrough_resolves_every_setting(quickstart_copy):
    tiny = quickstart_copy / "tiny"
    argvs = [readme_command("python", "-c"), readme_command("agenttune", "model", "init-tiny"),
             *[argv for argv in readme_commands() if argv[:4] == ["agenttune", "train", "--conf", QUICKSTART_CONF]]]
    assert len(argvs) == 4  # write the data, build the model, train three steps, resume to four
    for argv in argvs:
        argv = [str(tiny) if word == "/tmp/tiny" else word.replace("=/tmp/tiny", f"={tiny}") for word in argv]
        if argv[1] == "train":  # check it instead: everything a run needs, resolved, nothing started
            argv = ["agenttune", "config", "check", *without_run_options(argv[2:])]
            assert "verl.trainer.device=cpu" in argv
        result = run(argv, quickstart_copy)
        assert result.returncode == 0, (argv, result.stdout + result.stderr)
    assert (quickstart_copy / "examples" / "quickstart" / "data" / "train.jsonl").is_file()


def without_run_options(args: list[str]) -> list[str]:
    """`train`'s own options that `config check` does not take (where the run goes, whether it resumes)."""
    kept, skip = [], False
    for word in args:
        if skip:
            skip = False
        elif word == "--run-dir":
            skip = True
        elif word != "--resume":
            kept.append(word)
    return kept
