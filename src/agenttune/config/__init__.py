"""What a run is configured with, below everything that reads it.

    models.py              AgentTuneConfig and its sections (pydantic models): what every run reads
    base.py                Section, NoOptions, Component: the bases every section and component share
    objective_options.py   `algorithm.dynamic_sampling`, `algorithm.overlong_shaping`
    correction_options.py  `algorithm.rollout_correction` (the options; the local backbone's maths is
                           backbones/local/rollout_correction.py)
    policies.py            `policies:`: several policies (LoRA adapters) in one run, agent name -> policy
    references.py          `package.module:Name` -> object
    in_process.py          references to objects handed to the Python API
    install_hints.py       which extra of an installed plugin brings a failing import
    run.py                 the run directory a config is written to, and the run's logging

Loading a config (YAML, overrides, environment) composes the sections the installed plugins add, so it
lives one floor up, in `agenttune.registry.config_loading`. The names `agenttune.config` held as one module
(`AgentTuneConfig`, `JudgeConfig`, ...) are still found here, looked up in `models.py` on first use.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    models = importlib.import_module("agenttune.config.models")
    if name.startswith("__") or not hasattr(models, name):
        raise AttributeError(f"module 'agenttune.config' has no attribute {name!r}")
    return getattr(models, name)
