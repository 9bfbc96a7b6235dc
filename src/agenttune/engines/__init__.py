"""Inference engines: `hf` (transformers, batched), `openai` (a served model), `scripted` (tests).

`build_engine(config, tokenizer, model=None)` builds the one `config.engine.type` names. Engine
modules import torch/transformers inside functions, so registering them stays cheap.
"""

from __future__ import annotations

from typing import Any

from agenttune.config import AgentTuneConfig
from agenttune.config_loader import component_options
from agenttune.engine import InferenceEngine
from agenttune.plugins import get_component


def engine_class(config: AgentTuneConfig) -> type[InferenceEngine]:
    """The class `config.engine.type` names (its ClassVars say what it can do, before it is built)."""
    return get_component("engines", config.engine.type, key="engine.type")


def build_engine(config: AgentTuneConfig, tokenizer: Any, model: Any = None) -> InferenceEngine:
    """The inference engine of `config.engine`; `model` is an already-loaded model to share (hf)."""
    engine_cls = engine_class(config)
    options = component_options(engine_cls, config.engine, "engine")
    return engine_cls.from_config(config, options, tokenizer, model=model)
