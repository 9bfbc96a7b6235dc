"""Load the model and tokenizer a config names (`model.path`, `model.tokenizer`), `tiny://` included.

Every backbone and engine goes through here, so a path means the same thing everywhere. Heavy
libraries are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agenttune.config import ModelConfig
from agenttune.errors import UserError
from agenttune.tiny_model import is_tiny_uri, tiny_model_dir


def resolve_model_path(path: str, *, key: str = "model.path") -> str:
    """A local directory or hub id for `path`; `tiny://NAME` is built (once) and cached."""
    if not path:
        raise UserError(f"{key} is not set.",
                        hint="Set it to a local model directory, a Hugging Face model id, or tiny://default "
                             "for a tiny test model built on this machine.")
    if is_tiny_uri(path):
        return str(tiny_model_dir(path))
    expanded = Path(path).expanduser()
    looks_local = path.startswith((".", "/", "~")) or expanded.exists()
    if looks_local and not expanded.is_dir():
        raise UserError(f"{key}: {path!r} is not a directory.",
                        hint="Point it at a model directory (with config.json), a Hugging Face model id, "
                             "or tiny://default.")
    return str(expanded) if looks_local else path


def load_tokenizer(model: ModelConfig) -> Any:
    """The tokenizer of `model.tokenizer` (or `model.path`); it must have a chat template."""
    from transformers import AutoTokenizer

    key = "model.tokenizer" if model.tokenizer else "model.path"
    source = resolve_model_path(model.tokenizer or model.path, key=key)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as error:
        raise UserError(f"{key}: cannot load a tokenizer from {source!r}: {error}",
                        hint="Check the path, or that the model id exists and is in the Hugging Face cache.") from error
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"{key}: the tokenizer at {source!r} has no chat template.",
                        hint="Use an instruct/chat model, or add a chat_template to its tokenizer_config.json.")
    return tokenizer


def torch_dtype(name: str, device: str) -> Any:
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, name)


def pick_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model(model: ModelConfig, *, device: str = "auto") -> Any:
    """The causal LM of `model.path`, on `device`, in eval mode."""
    from transformers import AutoModelForCausalLM

    source = resolve_model_path(model.path)
    device = pick_device(device)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype(model.dtype, device), trust_remote_code=model.trust_remote_code
        )
    except (OSError, ValueError) as error:
        raise UserError(f"model.path: cannot load a model from {source!r}: {error}",
                        hint="Check the path, or that the model id exists and is in the Hugging Face cache.") from error
    # transformers declares PreTrainedModel.to with @wraps(nn.Module.to); mypy then reads the bound
    # method as the unbound one and takes `device` for `self`.
    return loaded.to(device).eval()  # type: ignore[arg-type]
