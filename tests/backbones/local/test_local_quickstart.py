"""The quickstart example: its agent path (tool call through the gateway, judged), and a short
end-to-end run of `examples/quickstart/run.py` with the local backbone (CI smoke test)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"


def load_module(name: str):
    if str(QUICKSTART) not in sys.path:
        sys.path.insert(0, str(QUICKSTART))
    spec = importlib.util.spec_from_file_location(f"quickstart_{name}", QUICKSTART / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tasks_are_held_out_and_the_calculator_is_safe():
    arithmetic = load_module("arithmetic")
    validation = arithmetic.make_tasks(50, seed=1)
    train = arithmetic.make_tasks(500, seed=2, exclude={row["expression"] for row in validation})
    assert not {row["expression"] for row in train} & {row["expression"] for row in validation}
    for row in validation:
        assert arithmetic.calculate(row["expression"]) == str(row["ground_truth"])
    assert arithmetic.calculate("__import__('os').system('true')").startswith("error")
    assert arithmetic.calculate("9 ** 9 ** 9").startswith("error")
    assert arithmetic.parse_final_answer("The answer is -42.") == -42


def test_the_calculator_answers_a_malformed_expression_without_a_warning_on_stderr():
    """"3or 4" parses with a SyntaxWarning printed by the parser: the quickstart's output must not show it."""
    code = "import arithmetic; print(arithmetic.calculate('3or 4'))"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=QUICKSTART, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "error: not an arithmetic expression"
    assert done.stderr == ""


def test_the_agent_calls_the_tool_through_the_gateway_and_is_judged(tmp_path, run_cli, write_yaml):
    """A scripted model makes the right tool call, then answers with the tool's result: reward 1, one
    merged sample whose loss mask covers exactly the two generated replies."""
    rows = [{"task_id": "t0", "query": "What is 347 * 28 + 19?", "ground_truth": 9735, "expression": "347 * 28 + 19"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 28 + 19"}}\n</tool_call>'
    conf = write_yaml({
        "workflow": "calculator_agent:CalculatorAgent",
        "judge": {"judge_protocol": "arithmetic:ArithmeticJudge"},
        "task_reader": {"type": "file", "path": str(tmp_path / "train.jsonl")},
        "model": {"path": "tiny://default"},
        "engine": {"type": "scripted", "replies": [call, "The answer is 9735."]},
        "rollout": {"num_repeat": 1},
    })
    (tmp_path / "calculator_agent.py").write_text((QUICKSTART / "calculator_agent.py").read_text())
    (tmp_path / "arithmetic.py").write_text((QUICKSTART / "arithmetic.py").read_text())
    result = run_cli("train", "--conf", conf, "--backbone", "debug", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    from agenttune.rollout.log import read_records
    from agenttune.testing import tiny_tokenizer

    [record] = list(read_records(tmp_path / "run" / "rollouts" / "step_000001_train.jsonl"))
    assert record.reward == 1.0 and record.success and record.judge_details["answer"] == 9735
    assert [m["role"] for m in record.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert record.messages[3]["content"] == "9735"
    [sample] = record.samples
    assert sample.num_calls == 2
    tokenizer = tiny_tokenizer("default")
    trained = [token for token, mask in zip(sample.response_ids, sample.loss_mask, strict=True) if mask]
    expected = tokenizer.encode(call + "<|im_end|>" + "The answer is 9735.<|im_end|>", add_special_tokens=False)
    assert trained == expected


@pytest.mark.slow
def test_quickstart_smoke(tmp_path, monkeypatch):
    """A few steps of the real quickstart: warm-up, validation, RL, checkpoint, curves."""
    monkeypatch.setenv("COLUMNS", "160")
    run = load_module("run")
    run_dir = run.main([
        "--run-dir", str(tmp_path / "run"),
        "trainer.total_steps=2", "trainer.test_freq=2", "trainer.save_freq=2",
        "data.train_batch_size=2", "rollout.num_repeat=2", "data.val_batch_size=4",
        "local.warmup.steps=2", "local.warmup.batch_size=4",
    ], data=tmp_path / "data", conversations=50)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [0, 1, 2]
    assert records[0]["val/episodes"] == 4 and records[2]["val/episodes"] == 4
    assert records[1]["episodes"] == 4 and records[1]["failure_rate"] == 0.0
    assert (run_dir / "checkpoints" / "step_000002" / "model" / "model.safetensors").exists()
    assert (run_dir / "training_curves.png").exists()
