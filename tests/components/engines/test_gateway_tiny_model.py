"""The tiny model: a normal Hugging Face directory, deterministic, with a tools-capable chat template."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from agenttune.components.engines.model_loading import resolve_model_path
from agenttune.components.engines.tiny_model import TinySpec, build_tiny_model, tiny_model_dir
from agenttune.entrypoints.cli.main import main
from agenttune.errors import UserError

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def _digest(directory):
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


def test_loads_with_auto_classes(tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert model.config.model_type == "qwen2"
    assert model.config.num_hidden_layers == 4 and model.config.hidden_size == 128
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 1.5e6


def test_tokenizer_round_trips_text_and_agrees_with_tokenizer_json(tiny_model_path, tiny_tokenizer):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_model_path / "tokenizer.json"))
    rng = random.Random(7)
    alphabet = "ab cd\n\t 12{}\":<>é你"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        text += rng.choice(["", "<tool_call>", "<|im_end|>", "</think>"]) + text
        ids = tiny_tokenizer(text, add_special_tokens=False).input_ids
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert tiny_tokenizer.decode(ids) == text


def test_markup_tokens_are_single_tokens_and_survive_skip_special(tiny_tokenizer):
    for token in ("<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>"):
        ids = tiny_tokenizer(token, add_special_tokens=False).input_ids
        assert len(ids) == 1
        assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == token
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tiny_tokenizer.decode([im_end], skip_special_tokens=True) == ""


def test_chat_template_renders_tools_calls_results_and_thinking(tiny_tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "use the tool",
         "tool_calls": [{"id": "a", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                        {"id": "b", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text
    assert ("<|im_start|>assistant\n<think>\nuse the tool\n</think>\n\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    plain = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_building_is_deterministic_and_names_seed_the_weights(tmp_path, tiny_model_path):
    build_tiny_model(tmp_path / "again")
    assert _digest(tmp_path / "again") == _digest(tiny_model_path)
    build_tiny_model(tmp_path / "other", TinySpec(name="other"))
    assert _digest(tmp_path / "other")["model.safetensors"] != _digest(tiny_model_path)["model.safetensors"]
    assert _digest(tmp_path / "other")["tokenizer.json"] == _digest(tiny_model_path)["tokenizer.json"]


def test_tiny_uri_is_cached_under_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTTUNE_CACHE_DIR", str(tmp_path))
    path = resolve_model_path("tiny://small?layers=1&hidden=32")
    assert path == str(tmp_path / "tiny-models" / "small-layers1-hidden32-v1")
    assert json.loads((tmp_path / "tiny-models" / "small-layers1-hidden32-v1" / "config.json").read_text())[
        "num_hidden_layers"] == 1
    assert tiny_model_dir("tiny://small?layers=1&hidden=32") == tmp_path / "tiny-models" / "small-layers1-hidden32-v1"
    assert [p.name for p in (tmp_path / "tiny-models").iterdir()] == ["small-layers1-hidden32-v1"]


@pytest.mark.parametrize("uri, problem", [("tiny://x?depth=2", "unknown tiny-model parameter 'depth'"),
                                          ("tiny://x?layers=two", "is not an integer"),
                                          ("tiny://bad name", "must be letters")])
def test_bad_tiny_uris_are_user_errors(uri, problem):
    with pytest.raises(UserError, match=problem):
        TinySpec.from_uri(uri)


def test_model_path_errors(tmp_path):
    with pytest.raises(UserError, match="model.path is not set"):
        resolve_model_path("")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        resolve_model_path(str(tmp_path / "file.txt"))
    assert resolve_model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


def test_cli_init_tiny(tmp_path, capsys):
    main(["model", "init-tiny", str(tmp_path / "m"), "--layers", "2"])
    assert "Wrote a tiny model" in capsys.readouterr().out
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_hidden_layers"] == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["model", "init-tiny", str(tmp_path / "m")])
    assert exit_info.value.code == 2
    assert "not empty" in capsys.readouterr().err
