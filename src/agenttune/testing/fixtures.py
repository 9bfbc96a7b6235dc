"""Pytest fixtures for the tiny model (registered through the `pytest11` entry point).

`tiny_model_path`  the model directory (session scope; built once into the agenttune cache)
`tiny_tokenizer`   its tokenizer (session scope; shared, do not mutate)
`tiny_model`       a fresh model per test (safe to train)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agenttune import testing


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    return testing.tiny_model_path()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path: Path) -> Any:
    return testing.tiny_tokenizer()


@pytest.fixture
def tiny_model(tiny_model_path: Path) -> Any:
    return testing.load_tiny_model()
