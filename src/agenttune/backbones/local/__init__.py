"""`local`: GRPO training on this machine (CPU, or one GPU) with no Ray.

This module only declares the backbone; torch, transformers and peft are imported when it runs,
so listing plugins stays fast. The pieces:

    loop.py         roll out -> RL step -> validate -> checkpoint, with progress and metrics
    train_step.py   one step (advantages, policy loss, KL, micro-batches, AdamW)
    options.py      the `local:` section of the config
    advantages.py   what the estimator sees          loss.py      KL penalty, token averaging
    dynamic_sampling.py  refill the batch with informative groups (DAPO)
    batching.py     samples -> micro-batches         logprobs.py  per-token log-probs
    policy.py       model loading, LoRA, reference   warmup.py    supervised warm-up
    policies.py     several policies: an adapter, an optimizer and the agents' samples each
    checkpoint.py   save / resume                    export.py    standalone HF model
    task_order.py   seeded epochs                    monitor.py   TensorBoard, W&B, SwanLab
    progress.py     the progress bar                 report.py    curves PNG + summary table
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from agenttune.backbones.local.options import LocalOptions, local_options, trains_adapters
from agenttune.components.backbone import Backbone
from agenttune.errors import UserError

if TYPE_CHECKING:
    from agenttune.config.models import AgentTuneConfig
    from agenttune.config.run import Run

REQUIRED = {"torch": "torch", "transformers": "transformers", "matplotlib": "matplotlib"}
SUPPORTED_ENGINES = ("hf", "vllm")


class LocalBackbone(Backbone):
    name: ClassVar[str] = "local"
    description: ClassVar[str] = "GRPO on this machine (CPU or one GPU), no Ray; the engine shares the trained weights."
    Options: ClassVar[type[LocalOptions]] = LocalOptions

    @classmethod
    def check(cls, config: AgentTuneConfig) -> None:
        local = local_options(config)
        missing = [package for module, package in REQUIRED.items() if importlib.util.find_spec(module) is None]
        if trains_adapters(config) and importlib.util.find_spec("peft") is None:
            missing.append("peft")
        if config.monitor.tensorboard and importlib.util.find_spec("tensorboard") is None:
            missing.append("tensorboard")
        if missing:
            raise UserError(f"The local backbone needs {', '.join(missing)}, which is not installed.",
                            hint="Install agenttune's `local` extra: pip install 'agenttune[local]' "
                                 "(on CPU-only machines first: pip install torch==2.13.0).")
        if config.engine.type not in SUPPORTED_ENGINES:
            raise UserError(f"engine.type {config.engine.type!r} cannot serve the local backbone's rollouts.",
                            hint="The local backbone samples from the model it trains: use engine.type: hf "
                                 "(shares the weights in process) or vllm (GPU; weights loaded after each step).")
        if not config.model.path:
            raise UserError("model.path is not set.",
                            hint="Set model.path to a model directory, a Hugging Face model id, or tiny://default.")
        _check_policies(config)
        warmup = local.warmup.data
        if warmup and not Path(warmup).is_file():
            raise UserError(f"local.warmup.data: {warmup!r} does not exist.",
                            hint="Point it at a JSONL file of demonstration conversations, or remove the key.")
        from agenttune.backbones.local.monitor import check_trackers
        from agenttune.registry.manager import get_component

        check_trackers(config)
        estimator = get_component("advantage_estimators", config.algorithm.adv_estimator, key="algorithm.adv_estimator")
        estimator.check_group_size(config.rollout.num_repeat)

    def run(self, run: Run) -> None:
        from agenttune.backbones.local.loop import train

        train(run)


def _check_policies(config: AgentTuneConfig) -> None:
    """Several policies (config/policies.py): what this backbone does not do with them yet, refused up front."""
    from agenttune.config.policies import check_policies

    check_policies(config.policies, local_options(config).lora_rank)
    if not config.policies.enabled:
        return
    if config.engine.type != "hf":
        raise UserError(f"engine.type {config.engine.type!r} cannot serve several policies: only the hf engine runs "
                        "each agent's calls with its policy's adapter.",
                        hint="Use engine.type: hf with policies.adapters.")
    if local_options(config).warmup.data:
        raise UserError("local.warmup with several policies (policies.adapters) is not supported: the warm-up "
                        "would train one adapter for every role.",
                        hint="Warm the model up in a run of its own and start this one from it (model.path), "
                             "or give each policy trained weights with policies.adapters.<name>.init.")
