"""One policy (`policies:` with a single adapter, docs/multi_policy.md) on verl, on this CPU machine: verl's own
trainer trains the policy's LoRA adapter (peft, in its FSDP engine), merges it into the base weights before
each weight sync, and agenttune's `hf` rollout server samples the next step with the merged weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_cpu_run import LOGPROB_TOLERANCE, max_difference, train, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RANK, ALPHA = 8, 16
MERGED_TOLERANCE = 5e-3


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Path:
    root = tmp_path_factory.mktemp("cpu_lora")
    conf = write_config(root, tiny_model_path)
    data = yaml.safe_load(conf.read_text(encoding="utf-8"))
    # a large learning rate: one step moves the adapter far enough that the base model's log-probs differ
    data["policies"] = {"adapters": {"solver": {"rank": RANK, "alpha": ALPHA, "learning_rate": 1e-2}},
                        "default_policy": "solver"}
    conf.write_text(yaml.safe_dump(data), encoding="utf-8")
    run_dir = root / "run"
    phase = train(conf, run_dir, root / "probe", "trainer.total_steps=2")
    assert phase.leftovers == []
    return run_dir


def test_verl_trains_the_policys_adapter(lora_run):
    assert [json.loads(line)["step"] for line in (lora_run / "metrics.jsonl").open()] == [1, 2]
    meta = json.loads((lora_run / "checkpoints" / "global_step_1" / "actor" / "lora_train_meta.json").read_text())
    assert (meta["r"], meta["lora_alpha"]) == (RANK, ALPHA)
    adapter = lora_weights(lora_run, 1)
    assert adapter and all(".default." in name for name in adapter)
    assert any(tensor.abs().sum() > 0 for name, tensor in adapter.items() if "lora_B" in name)  # B moved off zero


def test_the_rollout_samples_with_the_adapter_merged_in(lora_run, tiny_model_path):
    """Step 2 was sampled after step 1's sync: its log-probs are the step-1 adapter's, not the base model's."""
    samples = [sample for line in (lora_run / "rollouts" / "step_000002_train.jsonl").open()
               for sample in json.loads(line)["samples"]]
    served = [logprob for sample in samples for logprob, mask in zip(sample["logprobs"], sample["loss_mask"],
                                                                    strict=True) if mask]
    with_adapter = token_logprobs(tiny_model_path, lora_weights(lora_run, 1), samples)
    base = token_logprobs(tiny_model_path, None, samples)
    # Served from merged weights (W + B A x scaling, summed once by verl before the sync), scored here by peft's
    # unmerged forward: measured 1.4e-3 at most (mean 5.6e-4) apart, where the base model is 0.74 apart.
    assert max_difference(served, with_adapter) < MERGED_TOLERANCE
    assert max_difference(served, base) > 20 * MERGED_TOLERANCE  # the check can tell them apart
    metrics = [json.loads(line) for line in (lora_run / "metrics.jsonl").open()]
    assert all(record["verl/training/rollout_probs_diff_max"] < LOGPROB_TOLERANCE for record in metrics)


def lora_weights(run_dir: Path, step: int) -> dict[str, Any]:
    """The adapter's tensors (peft names) in verl's actor checkpoint of `step` (one rank: whole shards)."""
    import torch

    path = run_dir / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    return {name: tensor.to_local() if hasattr(tensor, "to_local") else tensor
            for name, tensor in state.items() if "lora_" in name}


def token_logprobs(model_path: Path, adapter: dict[str, Any] | None, samples: list[dict[str, Any]]) -> list[float]:
    """Each sampled response token's log-prob (tool output excluded: loss mask 0) under the base model, or with
    the adapter (peft, as verl built it)."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    if adapter is not None:
        model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear"))
        names = {name.replace(".default.", "."): tensor for name, tensor in adapter.items()}
        result = set_peft_model_state_dict(model, names)
        assert not result.unexpected_keys
    model.eval()
    logprobs: list[float] = []
    with torch.no_grad():
        for sample in samples:
            prompt, response = sample["prompt_ids"], sample["response_ids"]
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
            picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]
            logprobs += [value for value, mask in zip(picked.tolist(), sample["loss_mask"], strict=True) if mask]
    return logprobs
