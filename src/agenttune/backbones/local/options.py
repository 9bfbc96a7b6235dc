"""The `local:` section: the local backbone's options (it owns them; see Backbone.Options)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from agenttune.config.base import Section

if TYPE_CHECKING:
    from agenttune.config.models import AgentTuneConfig


class WarmupOptions(Section):
    """Supervised warm-up before RL (`local.warmup`)."""

    data: str | None = Field(
        default=None,
        description="JSONL of demonstration conversations ({\"messages\": [...], \"tools\": [...]}) for a supervised "
        "warm-up before RL; none: no warm-up. Relative paths are relative to the current directory.",
    )
    steps: int = Field(default=100, ge=0, description="Warm-up optimizer steps.")
    batch_size: int = Field(default=32, gt=0, description="Conversations per warm-up step.")
    learning_rate: float = Field(default=1e-3, gt=0, description="Warm-up learning rate (constant, then a linear decay to 0 over the last 20% of the steps).")


class LocalOptions(Section):
    """The `local:` section: training on this machine."""

    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="Where the local backbone trains.")
    micro_batch_tokens: int = Field(default=8192, gt=0, description="Token budget of one micro-batch.")
    update_path: Literal["packed", "padded"] = Field(
        default="packed",
        description="packed: samples end to end in rows (little padding, micro-batches balanced by token count), "
        "log-probs and entropy from the hidden states in chunks, never the full logits. padded: one right-padded "
        "row per sample and the model's full float32 logits (the previous path, kept for comparison; docs/local.md).",
    )
    share_prompts: bool = Field(
        default=True,
        description="packed path: the samples of a group that start with the same prompt hold it once in their "
        "micro-batch, under a tree-shaped attention mask; the update runs the prompt once per group instead of once "
        "per sample (same log-probs and gradients). Needs sdpa or eager attention and no sliding windows; "
        "elsewhere (flash-attention) every sample runs whole.",
    )
    logits_chunk_tokens: int = Field(
        default=1024, gt=0,
        description="packed path: tokens whose logits exist at once (each chunk takes chunk x vocabulary x 4 bytes, "
        "~0.6 GB at 1024 tokens and a 151,936-token vocabulary, plus as much again for its softmax).",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        default="auto",
        description="Trade compute for memory (recompute each layer's activations in the backward). auto: on when "
        "the estimated activations of the longest micro-batch exceed half the device's memory (docs/local.md).",
    )
    optimizer_offload: bool = Field(
        default=False,
        description="Keep AdamW's states (2 x the trainable weights, float32) in CPU memory and run the optimizer "
        "step there; the GPU keeps weights and gradients only. Slower steps, for models whose optimizer would not fit.",
    )
    update_threads: int | None = Field(
        default=None, gt=0,
        description="On CPU: how many of the update's micro-batches compute at once, each on a thread of its own "
        "with one intra-op thread (a step is split into at least 4 micro-batches per thread). Independent threads "
        "never wait for one another, where one op's OpenMP team waits for every thread the decode thread or the "
        "agents preempt. None: torch's thread count. 1: one micro-batch after the other on an OpenMP team (torch's "
        "threads; asynchronous modes: the cores engine.cpu_threads leaves). Ignored off CPU.",
    )
    lora_rank: int = Field(default=0, ge=0, description="LoRA rank through peft; 0 trains all weights.")
    lora_alpha: int = Field(default=16, gt=0, description="LoRA alpha.")
    lora_target_modules: list[str] | str = Field(default="all-linear", description="Modules LoRA adapts.")
    mini_batches: int = Field(
        default=1, gt=0, description="Optimizer updates per step: the step's samples are split into this many mini-batches."
    )
    ppo_epochs: int = Field(default=1, gt=0, description="Passes over the step's samples (each pass does `mini_batches` updates).")
    keep_checkpoints: int = Field(default=2, gt=0, description="How many of the newest checkpoints to keep on disk.")
    plot: bool = Field(default=True, description="Write training_curves.png into the run directory at the end.")
    warmup: WarmupOptions = Field(default_factory=WarmupOptions, description="Supervised warm-up before RL (off by default).")


def local_options(config: AgentTuneConfig) -> LocalOptions:
    """The config's `local:` section (its defaults when the config was built without the local backbone)."""
    return config.section("local", LocalOptions)


def trains_adapters(config: AgentTuneConfig) -> bool:
    """Whether the policy is a peft model: a LoRA adapter (`local.lora_rank`) or one per policy (`policies:`)."""
    return local_options(config).lora_rank > 0 or config.policies.enabled
