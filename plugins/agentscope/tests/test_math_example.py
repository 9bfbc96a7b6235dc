"""examples/math_agent runs as its README says, on whichever AgentScope line this session installed.

The README's commands name no AgentScope line (`math_agent.py` imports the installed line's agent),
so the agentscope1 and agentscope2 sessions run the same commands, read from the README itself and
run from the repository root through the `agenttune` console script. Commands that need the hub
(GSM8K, Qwen2.5-7B-Instruct) run up to the hub, or through the README's local-copy route with the
tiny model in place of the hub model. The scripted debug run pins down one episode exactly: the model
calls the Python tool, the sandbox runs the code, the model answers in \\boxed{} and the judge rewards it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import LINE

from agenttune.plugin_api import load_reference

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "math_agent"
SMOKE = "examples/math_agent/math_agent_smoke.yaml"
HUB = "examples/math_agent/math_agent.yaml"
# The console script the README runs, from this session's environment (PATH may name another one).
AGENTTUNE = str(Path(sys.executable).with_name("agenttune"))
# How an episode of the random tiny model may end without anything failing: its noise can read as a
# broken tool call (madness: penalised, still trained) or keep the agent calling until its turn limit.
NORMAL_ENDS = ("ok", "madness", "turn_limit")


def readme_commands() -> list[list[str]]:
    """The README's shell commands as argument lists: continuation lines joined, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (EXAMPLE / "README.md").read_text(), re.DOTALL)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]


def readme_command(*prefix: str) -> list[str]:
    """The one README command that starts with `prefix`: a test fails when the README drops or changes it."""
    [argv] = [argv for argv in readme_commands() if argv[:len(prefix)] == list(prefix)]
    return argv


def run(argv: list[str], cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "agenttune", argv
    # Wide: rich folds no error paragraph in two. HF_HUB_OFFLINE (conftest): no hub calls, no retry waits.
    environment = {**os.environ, "COLUMNS": "500", **env}
    return subprocess.run([AGENTTUNE, *argv[1:]], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=300)


def paragraph(result: subprocess.CompletedProcess[str]) -> str:
    return " ".join((result.stdout + result.stderr).split())


@pytest.fixture
def new_runs() -> Iterator[Callable[[], list[Path]]]:
    """The run directories a README command made under the repository's runs/ (where it writes them),
    removed afterwards; runs that were there before are left alone."""
    base = REPO / "runs" / "math_agent" / "smoke"
    before = set(base.glob("*"))

    def made() -> list[Path]:
        return sorted(set(base.glob("*")) - before)

    yield made
    for directory in made():
        shutil.rmtree(directory, ignore_errors=True)
    for parent in (base, base.parent, base.parent.parent):  # runs/math_agent/smoke, if now empty: the checkout as it was
        try:
            parent.rmdir()
        except OSError:  # not empty (someone's runs) or not there
            break


def episodes(run_dir: Path) -> list[dict]:
    [log] = (run_dir / "rollouts").glob("*.jsonl")
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_configs_workflow_is_the_installed_lines_agent():
    workflow = load_reference("math_agent:MathAgentWorkflow", key="workflow", search_path=EXAMPLE)
    assert workflow.__module__ == f"math_agent_v{LINE}"


def test_readme_smoke_run_debug(new_runs):
    result = run(readme_command("agenttune", "train", "--conf", SMOKE, "--backbone", "debug"))

    assert result.returncode == 0, result.stdout + result.stderr
    [run_dir] = new_runs()
    rollouts = episodes(run_dir)
    assert len(rollouts) == 4  # debug.first_n_tasks 2 x rollout.num_repeat 2
    for episode in rollouts:  # the random model answers noise, but every episode ends normally, trainable
        assert episode["status"] in NORMAL_ENDS, (episode["status"], episode["error"])
        assert episode["samples"] and isinstance(episode["reward"], float)
        if episode["status"] != "turn_limit":  # judged (a madness penalty keeps the judge's details)
            assert episode["judge_details"]["ground_truth"]


def test_readme_smoke_run_local(new_runs):
    result = run(readme_command("agenttune", "train", "--conf", SMOKE, "--backbone", "local"))

    assert result.returncode == 0, result.stdout + result.stderr
    [run_dir] = new_runs()
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [1]
    assert (run_dir / "checkpoints").is_dir()


def test_hub_config_resolves_up_to_the_hub_model(tmp_path):
    """`config show` of the GPU config: workflow (on this line), framework, reader and judge resolve;
    it stops at the model, which an offline machine cannot read, in one paragraph."""
    result = run(["agenttune", "config", "show", "--conf", HUB], HF_HUB_CACHE=str(tmp_path))

    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in paragraph(result)
    assert "Error: model.path: cannot read the model's config from 'Qwen/Qwen2.5-7B-Instruct'" in paragraph(result)


def test_readme_local_copy_route(tmp_path):
    """The README's route for machines without the hub: `data download` saves GSM8K as Parquet under
    data/openai/gsm8k/main, and the hub config reads that copy. The copy here is the example's own
    GSM8K-shaped rows in that layout (the hub is unreachable); the tiny model stands in for Qwen."""
    import datasets

    download = readme_command("agenttune", "data", "download", "openai/gsm8k")
    copy = tmp_path / download[download.index("--path") + 1] / "openai" / "gsm8k" / download[download.index("--name") + 1]
    copy.mkdir(parents=True)
    for split in ("train", "test"):
        rows = datasets.Dataset.from_json(str(EXAMPLE / "data" / "gsm8k" / f"{split}.jsonl"))
        rows.to_parquet(str(copy / f"{split}-00000-of-00001.parquet"))  # hub_download's file names
    train = readme_command("agenttune", "train", "--conf", HUB, "--backbone", "debug", "task_reader.dataset_path=data/openai/gsm8k/main")
    train[train.index(HUB)] = str(REPO / HUB)  # run where the copy is: data/ is relative to the working directory
    small = ["model.path=tiny://default", "rollout.max_response_length_in_one_turn=16", "rollout.num_repeat=1",
             "debug.first_n_tasks=1"]

    result = run([*train, *small], cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    [run_dir] = (tmp_path / "runs" / "math_agent" / "gsm8k_react").glob("*")
    [episode] = episodes(run_dir)
    assert episode["status"] in NORMAL_ENDS, (episode["status"], episode["error"])
    # The gsm8k columns preset applied to the copy: question -> query, the number after #### -> ground truth.
    first = json.loads((EXAMPLE / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[0])
    assert episode["task"]["query"] == first["question"]
    assert episode["task"]["metadata"]["ground_truth"] == first["answer"].split("####")[-1].strip()


def test_debug_backbone_solves_with_the_python_tool(tmp_path):
    call = "<tool_call>\n" + json.dumps({"name": "execute_python_code",
                                         "arguments": {"code": "print(3 * 4 + 2)"}}) + "\n</tool_call>"
    replies = json.dumps([call, "She spends \\boxed{14} dollars."])
    command = ["agenttune", "train", "--conf", SMOKE, "--backbone", "debug", "--run-dir", str(tmp_path),
               "engine.type=scripted", f"engine.replies={replies}", "debug.first_n_tasks=1", "debug.max_parallel=1"]

    result = run(command)

    assert result.returncode == 0, result.stdout + result.stderr
    rollouts = episodes(tmp_path)
    assert len(rollouts) == 2  # one task, rollout.num_repeat = 2
    for episode in rollouts:
        assert (episode["status"], episode["reward"], episode["success"]) == ("ok", 1.0, True)
        tool_results = [m["content"] for m in episode["messages"] if m["role"] == "tool"]
        assert tool_results == ["<returncode>0</returncode><stdout>14\n</stdout><stderr></stderr>"]
        assert episode["samples"][0]["num_calls"] == 2  # tool call and answer, one merged sample
