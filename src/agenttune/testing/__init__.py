"""Test helpers for agenttune and its plugins: a tiny local model, its tokenizer, scripted engines.

Pytest fixtures live in `agenttune.testing.fixtures`; they are registered as a pytest plugin (entry
point `pytest11`), so any test suite in an environment with agenttune installed can use them:

    def test_something(tiny_model_path, tiny_tokenizer): ...

Outside pytest, call the functions below. Nothing here downloads anything. Beside them:

    gateways          a running gateway over the tiny tokenizer (`running_gateway`, `tiny_config`)
    scripted_episode  one episode whose engine plays scripted replies, for agent-framework tests
    agents            a small multi-turn tool agent, for backbone tests
    gsm8k             GSM8K's first two train rows
    loopback          serve an ASGI app on a free loopback port
    judge_server      a scripted OpenAI-compatible chat server, for LLM-judge tests
    faults            fault injection for reliability tests
    config_walk       every config key through a backbone's translation (no option silently dropped)
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from agenttune.components.engines.tiny_model import tiny_model_dir

__all__ = ["tiny_model_path", "tiny_tokenizer", "load_tiny_model"]  # gateways: see agenttune.testing.gateways


def tiny_model_path(name: str = "default") -> Path:
    """The directory of the cached tiny model `tiny://NAME` (built on first use)."""
    return tiny_model_dir(name)


@cache
def tiny_tokenizer(name: str = "default") -> Any:
    """The tiny model's tokenizer (shared: do not mutate it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path(name))


def load_tiny_model(name: str = "default") -> Any:
    """A fresh copy of the tiny model (float32, CPU, eval mode): safe to train or modify."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path(name)).eval()
