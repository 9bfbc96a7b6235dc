"""Inference engines: `hf` (transformers, batched), `openai` (a served model), `scripted` (tests).

The contract is `base.py` (`InferenceEngine`); `agenttune.registry.resolution.build_engine(config, tokenizer,
model=None)` builds the one `config.engine.type` names. Engine modules import torch/transformers
inside functions, so registering them stays cheap.
"""
