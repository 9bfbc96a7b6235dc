"""Load the model and tokenizer a config names (`model.path`, `model.tokenizer`), `tiny://` included.

Every backbone and engine goes through here, so a path means the same thing everywhere. Heavy
libraries are imported inside the functions. `read_model_config` and `check_tokenizer` check a model
without loading it (`agenttune config check`): a local directory's files are read as they are
(config.json as JSON, tokenizer.json with the light `tokenizers` library), importing neither torch
nor transformers; a Hugging Face model id goes through transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agenttune.components.engines.tiny_model import is_tiny_uri, tiny_model_dir
from agenttune.config.models import ModelConfig
from agenttune.errors import UserError


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
        raise _no_chat_template(key, source)
    return tokenizer


def read_model_config(model: ModelConfig) -> dict[str, Any]:
    """The model's config as a dict: a local directory's config.json as JSON, a model id's through AutoConfig."""
    source = resolve_model_path(model.path)
    problem = "cannot read the model's config from"
    if not Path(source).is_dir():
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(source, trust_remote_code=model.trust_remote_code).to_dict()
        except (OSError, ValueError) as error:
            raise _model_error(f"{problem} {source!r}: {error}") from error
    config = _json_file(Path(source) / "config.json", lambda why: _model_error(f"{problem} {source!r}: {why}"))
    if config is None:
        raise _model_error(f"{problem} {source!r}: the directory has no config.json")
    if not isinstance(config.get("model_type"), str):
        raise _model_error(f"{problem} {source!r}: its config.json has no `model_type`, so transformers cannot "
                           "tell the architecture")
    return config


def context_window(model_config: dict[str, Any]) -> int | None:
    """The model's context length as its config states it (multimodal models: their text model's)."""
    for config in (model_config, model_config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(config.get(key), int):
                return config[key]
    return None


def check_tokenizer(model: ModelConfig) -> None:
    """Refuse, as `load_tokenizer` would, a tokenizer that does not load or has no chat template.

    A local directory with a tokenizer.json and no custom tokenizer code is checked from its files
    (no transformers import); anything else is loaded with `load_tokenizer`.
    """
    key = "model.tokenizer" if model.tokenizer else "model.path"
    source = resolve_model_path(model.tokenizer or model.path, key=key)
    directory = Path(source)
    if not (directory / "tokenizer.json").is_file():
        load_tokenizer(model)  # a model id, or only slow-tokenizer files (vocab + merges, sentencepiece)
        return
    try:
        from tokenizers import Tokenizer
    except ImportError:  # transformers brings it: without either, this fails as loading it in `train` would
        load_tokenizer(model)
        return

    def cannot_load(why: str) -> UserError:
        return UserError(f"{key}: cannot load a tokenizer from {source!r}: {why}",
                         hint="Check the tokenizer files, or that the model directory is complete.")

    settings = _json_file(directory / "tokenizer_config.json", cannot_load) or {}
    if "auto_map" in settings or "fast_tokenizer_files" in settings:  # the model's own code, or versioned files
        load_tokenizer(model)
        return
    try:
        Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as error:  # the Rust parser's errors are plain Exceptions
        raise cannot_load(f"tokenizer.json: {error}") from error
    has_template = (settings.get("chat_template") or _nonempty(directory / "chat_template.jinja")
                    or any(directory.glob("additional_chat_templates/*.jinja")))
    if not has_template:
        raise _no_chat_template(key, source)


def _json_file(path: Path, error: Any) -> dict[str, Any] | None:
    """`path` parsed as a JSON object, None if it does not exist; `error(why)` builds what is raised."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as problem:
        raise error(f"{path.name} is not valid JSON ({problem})") from problem
    if not isinstance(data, dict):
        raise error(f"{path.name} is not a JSON object")
    return data


def _nonempty(path: Path) -> bool:
    return path.is_file() and bool(path.read_text(encoding="utf-8").strip())


def _model_error(message: str) -> UserError:
    return UserError(f"model.path: {message}",
                     hint="Point model.path at a model directory with a config.json, or a Hugging Face model id.")


def _no_chat_template(key: str, source: str) -> UserError:
    return UserError(f"{key}: the tokenizer at {source!r} has no chat template.",
                     hint="Use an instruct/chat model, or add a chat_template to its tokenizer_config.json.")


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
