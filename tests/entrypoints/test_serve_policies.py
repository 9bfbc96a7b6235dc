"""`agenttune serve` with several policies (docs/multi_policy.md): the real command over loopback HTTP,
loading two trained-looking adapters from a checkpoint's model/ directory; `model: writer` in a request
samples with the writer's adapter, which the rollout log records and the adapter's own forward pass
confirms (logprobs within 1e-5)."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import openai
import pytest
import yaml

from agenttune.rollout.log import read_records
from agenttune.testing.gateways import serve_process

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow  # a server process with the tiny model

LORA = {"r": 4, "lora_alpha": 16, "target_modules": "all-linear", "init_lora_weights": False}
POLICIES = {"adapters": {"writer": {"rank": 4, "alpha": 16}, "critic": {"rank": 4, "alpha": 16}},
            "agents": {"writer": "writer", "critic": "critic"}}


@pytest.fixture(scope="module")
def two_adapters(tiny_model_path, tmp_path_factory):
    """A model with two random (B != 0) adapters, and where they are saved as a checkpoint saves them."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path), peft.LoraConfig(**LORA),
                                adapter_name="writer")
    model.add_adapter("critic", peft.LoraConfig(**LORA))
    saved = tmp_path_factory.mktemp("checkpoint") / "model"
    model.save_pretrained(saved)
    return model.eval(), saved


def write_conf(tmp_path, tiny_model_path, policies=POLICIES):
    conf = tmp_path / "serve.yaml"
    conf.write_text(yaml.safe_dump({"model": {"path": str(tiny_model_path)}, "policies": policies,
                                    "rollout": {"max_response_length_in_one_turn": 12}}))
    return conf


def forward_logprobs(model, adapter, sample):
    ids = sample.prompt_ids + sample.response_ids
    model.set_adapter(adapter)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    picked = torch.log_softmax(logits, -1)[len(sample.prompt_ids) - 1:-1].gather(
        1, torch.tensor(sample.response_ids)[:, None]).squeeze(1)
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    return picked[mask], torch.tensor(sample.logprobs)[mask]


def test_model_names_a_policy_and_its_adapter_samples(two_adapters, tiny_model_path, tmp_path):
    model, saved = two_adapters
    run_dir = tmp_path / "run"
    process, base_url = serve_process("--conf", str(write_conf(tmp_path, tiny_model_path)), "--adapters", str(saved),
                                      "--run-dir", str(run_dir))
    try:
        listed = httpx.get(f"{base_url}/models", timeout=10).json()["data"]
        assert [entry["id"] for entry in listed] == [str(tiny_model_path), "critic", "writer"]  # (the YAML's order)
        for name in ("writer", "critic", "anything"):
            client = openai.OpenAI(base_url=base_url, api_key=f"ask-{name}", max_retries=0)
            client.chat.completions.create(model=name, messages=[{"role": "user", "content": f"Hi {name}"}], seed=3)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    [log] = (run_dir / "rollouts").glob("step_*_serve.jsonl")
    samples = {record.episode_id: record.samples[0] for record in read_records(log)}
    assert {key: sample.policy for key, sample in samples.items()} == {
        "ask-writer": "writer", "ask-critic": "critic", "ask-anything": None}
    for key, adapter in (("ask-writer", "writer"), ("ask-critic", "critic")):
        expected, sampled = forward_logprobs(model, adapter, samples[key])
        assert len(sampled) > 0
        assert torch.allclose(sampled, expected, rtol=0, atol=1e-5), key
        other, _ = forward_logprobs(model, "critic" if adapter == "writer" else "writer", samples[key])
        assert not torch.allclose(sampled, other, atol=1e-3)  # not the other adapter's tokens
    with model.disable_adapter(), torch.inference_mode():  # "anything" names no policy: the base model
        sample = samples["ask-anything"]
        logits = model(torch.tensor([sample.prompt_ids + sample.response_ids])).logits[0]
        base = torch.log_softmax(logits, -1)[len(sample.prompt_ids) - 1:-1].gather(
            1, torch.tensor(sample.response_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(sample.logprobs)[torch.tensor(sample.loss_mask, dtype=torch.bool)],
                          base[torch.tensor(sample.loss_mask, dtype=torch.bool)], rtol=0, atol=1e-5)


@pytest.mark.parametrize(("arguments", "says"), [
    (["--adapters", "{missing}"], "is not a directory"),
    (["--adapters", "{saved}", "policies.adapters.writer.rank=2"], "Cannot load policy 'writer'"),
])
def test_adapters_that_cannot_be_served_are_one_paragraph(two_adapters, tiny_model_path, tmp_path, arguments, says):
    _, saved = two_adapters
    arguments = [argument.format(missing=tmp_path / "missing", saved=saved) for argument in arguments]
    done = subprocess.run([sys.executable, "-m", "agenttune", "serve", "--port", "0", "--conf",
                           str(write_conf(tmp_path, tiny_model_path)), *arguments],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
