"""The base model the server serves, with a LoRA adapter per training client and sampler checkpoint.

All adapters live in one peft model on the one base model (peft's named adapters): a training
client's adapter is made active for its forward/backward, and sampling from the base model disables
every adapter. Adapters are saved and loaded as their state dicts plus a peft `adapter_config.json`,
so a checkpoint is a plain peft adapter directory. Everything here runs on the futures' worker thread.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LORA_ALPHA = 32  # Tinker's documented LoRA alpha; the rank is the client's
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
UNEMBED = ["lm_head"]
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraSettings:
    """What `create_model`'s LoraConfig asks for (and a checkpoint's metadata records)."""

    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    def target_modules(self) -> list[str]:
        return [*(ATTENTION if self.train_attn else []), *(MLP if self.train_mlp else []),
                *(UNEMBED if self.train_unembed else [])]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ModelHost:
    """The base model and tokenizer, and the LoRA adapters on it."""

    def __init__(self, name: str, path: str, *, device: str = "auto"):
        from agenttune.components.engines.model_loading import load_model, load_tokenizer
        from agenttune.config.models import ModelConfig

        self.name = name  # what clients call the base model (the --model argument)
        self.path = path  # the resolved directory or hub id
        config = ModelConfig(path=path)
        self.tokenizer = load_tokenizer(config)
        self.model: Any = load_model(config, device=device)
        self.peft: Any = None  # the peft model, once the first adapter exists
        self._names = itertools.count()

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def context_length(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    def add_adapter(self, lora: LoraSettings, *, prefix: str = "run") -> str:
        """A new adapter (B = 0: the model is unchanged until trained), seeded by `lora.seed`; its name."""
        import torch
        from peft import LoraConfig

        targets = lora.target_modules()
        if not targets:
            raise ValueError("a LoRA adapter needs at least one of train_mlp, train_attn, train_unembed")
        name = f"{prefix}{next(self._names)}"
        config = LoraConfig(r=lora.rank, lora_alpha=LORA_ALPHA, target_modules=targets, lora_dropout=0.0,
                            task_type="CAUSAL_LM")
        with torch.random.fork_rng(devices=[]):  # the seed picks this adapter's A, and nothing else's
            if lora.seed is not None:
                torch.manual_seed(lora.seed)
            self._attach(name, config)
        return name

    def load_adapter(self, directory: Path, *, prefix: str = "run") -> str:
        """A new adapter with the weights saved in `directory` (by `save_adapter`); its name."""
        from peft import LoraConfig
        from safetensors.torch import load_file

        name = f"{prefix}{next(self._names)}"
        self._attach(name, LoraConfig.from_pretrained(str(directory)))
        self.set_weights(name, load_file(str(directory / WEIGHTS_FILE), device=str(self.device)))
        return name

    def set_weights(self, name: str, state: dict[str, Any]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.peft, state, adapter_name=name)
        unexpected = [key for key in getattr(result, "unexpected_keys", []) if "lora_" in key]
        if unexpected:
            raise ValueError(f"the saved adapter does not fit this model: {unexpected[:3]}")

    def weights(self, name: str) -> dict[str, Any]:
        from peft import get_peft_model_state_dict

        return {key: value.detach().clone() for key, value in
                # not the tied embedding a LoRA on lm_head would drag in: only the adapter is saved
                get_peft_model_state_dict(self.peft, adapter_name=name, save_embedding_layers=False).items()}

    def save_adapter(self, name: str, directory: Path) -> None:
        from safetensors.torch import save_file

        self.peft.peft_config[name].save_pretrained(str(directory))
        save_file({key: value.contiguous().cpu() for key, value in self.weights(name).items()},
                  str(directory / WEIGHTS_FILE))

    def remove_adapter(self, name: str) -> None:
        if self.peft is None or name not in self.peft.peft_config:
            return
        if len(self.peft.peft_config) == 1:  # peft cannot run without an adapter: back to the bare model
            self.model = self.peft.unload()
            self.peft = None
        else:
            self.peft.delete_adapter(name)

    def parameters(self, name: str) -> list[Any]:
        """The adapter's trainable tensors, in a fixed order (an optimizer's saved state follows it)."""
        marks = (f".lora_A.{name}.", f".lora_B.{name}.")
        named = [(key, param) for key, param in self.peft.named_parameters() if any(m in key for m in marks)]
        for _, param in named:
            param.requires_grad_(True)
        return [param for _, param in sorted(named, key=lambda item: item[0])]

    @contextlib.contextmanager
    def using(self, name: str | None) -> Iterator[Any]:
        """The model with adapter `name` active, or the bare base model (None)."""
        if self.peft is None:
            if name is not None:
                raise KeyError(name)
            yield self.model
            return
        if name is None:
            with self.peft.disable_adapter():
                yield self.peft
            return
        self.peft.set_adapter(name)
        self.parameters(name)  # set_adapter may leave them frozen
        yield self.peft

    def _attach(self, name: str, config: Any) -> None:
        from peft import get_peft_model

        with warnings.catch_warnings():
            # A LoRA on a tied lm_head: peft warns for merging, which never happens here (the frozen
            # embedding stays tied; only lm_head's output gets the adapter's delta).
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*", category=UserWarning)
            if self.peft is None:
                self.peft = get_peft_model(self.model, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
