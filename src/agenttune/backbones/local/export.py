"""`agenttune export RUN_DIR --out DIR`: a checkpoint as a standalone Hugging Face model.

LoRA adapters are merged into the base weights, so `AutoModelForCausalLM.from_pretrained(DIR)` and
`vllm serve DIR` load the result with no agenttune and no peft installed.
"""

from __future__ import annotations

from pathlib import Path

import agenttune.backbones.local.checkpoint as checkpoints
from agenttune.errors import UserError


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """The checkpoint of `step`, or the latest one; a UserError naming what exists otherwise."""
    found = checkpoints.list_checkpoints(Path(run_dir) / "checkpoints")
    if not found:
        raise UserError(f"{str(run_dir)!r} has no checkpoints.",
                        hint="Point at the run directory of a local-backbone run (it has checkpoints/step_*).")
    if step is None:
        return found[-1]
    wanted = checkpoints.checkpoint_dir(Path(run_dir) / "checkpoints", step)
    if wanted not in found:
        steps = ", ".join(path.name[len(checkpoints.PREFIX):].lstrip("0") or "0" for path in found)
        raise UserError(f"{str(run_dir)!r} has no checkpoint of step {step}.", hint=f"Available steps: {steps}.")
    return wanted


def export_model(run_dir: Path, out: Path, *, step: int | None = None, force: bool = False,
                 policy: str | None = None) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = find_checkpoint(run_dir, step)
    state = checkpoints.read_state(source)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise UserError(f"{str(out)!r} exists and is not empty.", hint="Pick a new directory or pass --force.")
    if state.lora:
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(state.base_model, dtype="auto")
        adapter = _adapter_dir(source / "model", state.extra.get("policies"), policy)
        model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    else:
        _adapter_dir(source / "model", None, policy)  # a policy named for a run without policies is refused
        model = AutoModelForCausalLM.from_pretrained(source / "model", dtype="auto")
    model.config.use_cache = True  # training switched it off; inference wants it
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source / "model").save_pretrained(out)
    return out


def _adapter_dir(model_dir: Path, policies: list[str] | None, policy: str | None) -> Path:
    """The checkpoint's adapter to merge: the run's one, or the named policy's (docs/multi_policy.md)."""
    if policies is None:
        if policy is not None:
            raise UserError(f"--policy {policy}: this run trained one policy, not several.",
                            hint="Leave --policy out.")
        return model_dir
    if policy not in policies:
        raise UserError(f"This run trained several policies ({', '.join(policies)}); --policy "
                        f"{'is missing' if policy is None else f'{policy} is none of them'}.",
                        hint="Export one policy at a time: --policy NAME.")
    return model_dir if policy == "default" else model_dir / policy
