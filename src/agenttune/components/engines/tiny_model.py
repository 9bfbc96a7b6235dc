"""A tiny Qwen2-architecture model with a byte-level BPE tokenizer, built in code (no downloads).

It is what tests, examples and CPU debugging runs use as "the model under training": a normal
Hugging Face directory (config.json, model.safetensors, tokenizer.json, chat template) that
`AutoTokenizer` and `AutoModelForCausalLM` load like any other. The chat template speaks the
Qwen/Hermes tool protocol, so gateways, parsers and agent frameworks see a realistic model.

    agenttune model init-tiny DIR          # write one to DIR
    model: {path: "tiny://default"}        # build once, cache, reuse (see `tiny_model_dir`)

`tiny://NAME` models are cached under `$AGENTTUNE_CACHE_DIR/tiny-models/` (default
`$XDG_CACHE_HOME/agenttune` or `~/.cache/agenttune`). The NAME seeds the weights, so two names give
two different models; query parameters change the shape: `tiny://wide?hidden=256&layers=2`.
Building is deterministic: the same name and shape always give the same files.

Heavy libraries (torch, transformers, tokenizers) are imported inside functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from agenttune.errors import UserError

TINY_SCHEME = "tiny://"
FORMAT_VERSION = 1  # bump when the build changes, so stale caches are rebuilt

# Qwen's special tokens. `<tool_call>` & co. are added tokens that are *not* special: they survive
# decoding with skip_special_tokens=True, so tool-call parsers see them (as with real Qwen models).
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
                 "<tools>", "</tools>"]

# The tokenizer's merges are learned from this text: chat markup, JSON and everyday words, so common
# pieces become single tokens and sequences stay short.
_CORPUS = """
You are a helpful assistant. You are a helpful math assistant. Answer the question step by step.
The user asks a question and the assistant answers it. Please reason step by step, and put your final
answer within \\boxed{}. What is the weather like today? Let me think about this problem carefully.
First, we add the numbers. Then we multiply the result by two. The answer is 42. The answer is 7.
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
For each function call, return a json object with function name and arguments within XML tags:
{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
"required": ["city"]}}}
{"name": "execute_python_code", "arguments": {"code": "print(1 + 2)"}}
{"name": "search", "arguments": {"query": "capital of France"}}
{"result": "ok", "temperature": 21, "unit": "celsius", "error": null, "success": true, "value": false}
Paris is the capital of France. The temperature in Berlin is 18 degrees. Tool result: 3
user assistant system tool function name arguments content role call response
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 60 70 80 90 100 1000
+ - * / = ( ) [ ] { } < > , . : ; ? ! " ' \\ _ # @ $ % & | ~ ^
the of and to in is it that for on with as was at by be this from or an are not have has had
question answer result number total sum product difference step solution final python code print
return def import if else for while in range len list dict str int float True False None
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether in April and May? #### 72
"""


@dataclass(frozen=True)
class TinySpec:
    """The shape of a tiny model. `name` seeds the weights."""

    name: str = "default"
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 1024
    max_positions: int = 8192

    @classmethod
    def from_uri(cls, uri: str) -> TinySpec:
        """`tiny://NAME?layers=2&hidden=64` -> TinySpec."""
        parts = urlsplit(uri)
        name = parts.netloc or parts.path.strip("/") or "default"
        shape: dict[str, int] = {}
        for key, value in parse_qsl(parts.query):
            if key not in cls.__dataclass_fields__ or key == "name":
                allowed = ", ".join(f for f in cls.__dataclass_fields__ if f != "name")
                raise UserError(f"model.path {uri!r}: unknown tiny-model parameter {key!r}.",
                                hint=f"Allowed parameters: {allowed}.")
            try:
                shape[key] = int(value)
            except ValueError:
                raise UserError(f"model.path {uri!r}: parameter {key}={value!r} is not an integer.") from None
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise UserError(f"model.path {uri!r}: the tiny-model name {name!r} must be letters, digits, '-', '_'.")
        return cls(name=name, **shape)

    @property
    def seed(self) -> int:
        return int.from_bytes(hashlib.sha256(self.name.encode()).digest()[:4], "little")

    @property
    def cache_key(self) -> str:
        default = TinySpec(name=self.name)
        changed = [f"{key}{value}" for key, value in asdict(self).items() if value != asdict(default)[key]]
        return "-".join([self.name, *changed, f"v{FORMAT_VERSION}"])


def cache_dir() -> Path:
    """Where agenttune caches built artefacts: $AGENTTUNE_CACHE_DIR, else $XDG_CACHE_HOME/agenttune."""
    if os.environ.get("AGENTTUNE_CACHE_DIR"):
        return Path(os.environ["AGENTTUNE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "agenttune"


def is_tiny_uri(path: str) -> bool:
    return path.startswith(TINY_SCHEME)


def tiny_model_dir(uri_or_name: str = "default") -> Path:
    """The directory of a cached tiny model, building it on first use (safe across processes)."""
    uri = uri_or_name if is_tiny_uri(uri_or_name) else TINY_SCHEME + uri_or_name
    spec = TinySpec.from_uri(uri)
    target = cache_dir() / "tiny-models" / spec.cache_key
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.cache_key}-", dir=target.parent))
    try:
        build_tiny_model(staging, spec)
        try:
            staging.rename(target)  # atomic: a racing process either wins or finds the finished model
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def chat_template() -> str:
    return resources.files("agenttune.components.engines").joinpath("tiny_chat_template.jinja").read_text(encoding="utf-8")


def build_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer (a `PreTrainedTokenizerFast`) with Qwen's special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Exactly Qwen2's pipeline, so loading through Qwen2Tokenizer (what AutoTokenizer picks for a
    # qwen2 model) tokenizes the same way as tokenizer.json.
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=TinySpec.max_positions,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(MARKUP_TOKENS)
    tokenizer.chat_template = chat_template()
    return tokenizer


def build_tiny_model(directory: str | Path, spec: TinySpec | None = None) -> Path:
    """Write a randomly initialised tiny model and its tokenizer to `directory`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinySpec()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab)
    eos_ids = [tokenizer.convert_tokens_to_ids(token) for token in ("<|im_end|>", "<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        bos_token_id=eos_ids[1],
        eos_token_id=eos_ids[0],
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(spec.seed)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, bos_token_id=eos_ids[1]
    )
    with _quiet_transformers():
        model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    _name_tokenizer_class(directory / "tokenizer_config.json", "Qwen2Tokenizer")
    return directory


def _name_tokenizer_class(path: Path, name: str) -> None:
    """Name the real class, so older transformers (4.x: Qwen2TokenizerFast) load it the same way."""
    settings = json.loads(path.read_text(encoding="utf-8"))
    settings["tokenizer_class"] = name
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


@contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
