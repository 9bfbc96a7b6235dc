"""`config check` checks a local model directory from its files (config.json, tokenizer.json, the chat
template) without importing transformers, and refuses what loading it would refuse (model_loading.py).

Each broken directory is a copy of the tiny model's small files (no weights: the check never reads
them), with one thing broken; the loaders `train` uses afterwards must refuse it too.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agenttune.components.engines.model_loading import load_tokenizer
from agenttune.config.models import AgentTuneConfig
from agenttune.errors import UserError
from agenttune.registry.resolution import check_model

FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


@pytest.fixture
def model_dir(tiny_model_path, tmp_path) -> Path:
    target = tmp_path / "model"
    target.mkdir()
    for name in FILES:
        shutil.copy(tiny_model_path / name, target / name)
    return target


def config_for(path: Path, **model) -> AgentTuneConfig:
    return AgentTuneConfig.model_validate({"model": {"path": str(path), "max_model_len": 1024, **model}})


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_the_tiny_models_files_pass(model_dir):
    check_model(config_for(model_dir))


def test_a_chat_template_in_tokenizer_config_json_counts(model_dir):
    template = (model_dir / "chat_template.jinja").read_text()
    (model_dir / "chat_template.jinja").unlink()
    edit_json(model_dir / "tokenizer_config.json", lambda data: data.update(chat_template=template))
    check_model(config_for(model_dir))
    assert load_tokenizer(config_for(model_dir).model).chat_template == template


BROKEN_MODELS = {
    "no config.json": (lambda path: (path / "config.json").unlink(), "the directory has no config.json"),
    "config.json not JSON": (lambda path: (path / "config.json").write_text("{"), "config.json is not valid JSON"),
    "no model_type": (lambda path: edit_json(path / "config.json", lambda data: data.pop("model_type")),
                      "its config.json has no `model_type`"),
}


@pytest.mark.parametrize("case", BROKEN_MODELS)
def test_a_broken_model_config_is_refused_as_transformers_would(model_dir, case):
    from transformers import AutoConfig

    breaks, expected = BROKEN_MODELS[case]
    breaks(model_dir)
    with pytest.raises(UserError) as raised:
        check_model(config_for(model_dir))
    assert f"model.path: cannot read the model's config from {str(model_dir)!r}: {expected}" in str(raised.value)
    with pytest.raises((OSError, ValueError)):  # what `train` would meet when it loads the model
        AutoConfig.from_pretrained(model_dir)


BROKEN_TOKENIZERS = {
    "tokenizer.json truncated": (lambda path: (path / "tokenizer.json").write_text('{"version": "1.0", "model": '),
                                 "cannot load a tokenizer from"),
    "tokenizer_config.json not JSON": (lambda path: (path / "tokenizer_config.json").write_text("[1,"),
                                       "tokenizer_config.json is not valid JSON"),
    "no chat template": (lambda path: (path / "chat_template.jinja").unlink(), "has no chat template"),
}


@pytest.mark.parametrize("case", BROKEN_TOKENIZERS)
def test_a_broken_tokenizer_is_refused_as_loading_it_would_be(model_dir, case):
    breaks, expected = BROKEN_TOKENIZERS[case]
    breaks(model_dir)
    with pytest.raises(UserError, match=expected) as raised:
        check_model(config_for(model_dir))
    assert str(raised.value).startswith("model.path: ")
    with pytest.raises((UserError, OSError, ValueError)):  # what `train` would meet
        load_tokenizer(config_for(model_dir).model)


def test_model_tokenizer_is_checked_where_it_points(model_dir, tmp_path):
    (model_dir / "chat_template.jinja").unlink()
    tokenizer_dir = tmp_path / "tokenizer"
    shutil.copytree(model_dir, tokenizer_dir)
    with pytest.raises(UserError, match=r"^model.tokenizer: the tokenizer at .* has no chat template"):
        check_model(config_for(model_dir, tokenizer=str(tokenizer_dir)))


def test_a_max_model_len_over_the_models_window_is_warned_about(model_dir):
    edit_json(model_dir / "config.json", lambda data: data.update(max_position_embeddings=512))
    with capture_logs() as logs:
        check_model(config_for(model_dir))
    (warning,) = [entry for entry in logs if "context window" in entry["event"]]
    assert warning["max_position_embeddings"] == 512 and warning["max_model_len"] == 1024
