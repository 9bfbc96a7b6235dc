"""agenttune's own components, registered through the same hooks as any plugin.

Each hook imports only the modules that define its classes; those modules keep heavy libraries
(torch, transformers) inside functions, so listing plugins stays fast.
"""

from __future__ import annotations

from agenttune.registry.hookspecs import hookimpl


@hookimpl
def register_task_readers():
    from agenttune.components.readers.file import FileTaskReader
    from agenttune.components.readers.huggingface import HuggingFaceTaskReader
    from agenttune.components.readers.in_memory import InMemoryTaskReader

    return [FileTaskReader, HuggingFaceTaskReader, InMemoryTaskReader]


@hookimpl
def register_agent_frameworks():
    from agenttune.components.frameworks.openai import OpenAIFramework

    return [OpenAIFramework]


@hookimpl
def register_judges():
    from agenttune.components.judges.llm_judge import LLMJudge

    return [LLMJudge]


@hookimpl
def register_backbones():
    from agenttune.backbones.debug import DebugBackbone
    from agenttune.backbones.local import LocalBackbone

    return [DebugBackbone, LocalBackbone]


@hookimpl
def register_engines():
    from agenttune.components.engines.hf import HFEngine
    from agenttune.components.engines.openai import OpenAIEngine
    from agenttune.components.engines.scripted import ScriptedEngine
    from agenttune.components.engines.vllm import VLLMEngine

    return [HFEngine, OpenAIEngine, ScriptedEngine, VLLMEngine]


@hookimpl
def register_tool_parsers():
    from agenttune.components.parsers.hermes import HermesToolParser

    return [HermesToolParser]


@hookimpl
def register_reasoning_parsers():
    from agenttune.components.parsers.think import ThinkParser

    return [ThinkParser]


@hookimpl
def register_advantage_estimators():
    from agenttune.components.estimators.outcome import (
        DrGRPOEstimator,
        GRPOEstimator,
        ReinforcePlusPlusBaselineEstimator,
        RLOOEstimator,
    )
    from agenttune.components.estimators.rejection import RejectionSamplingEstimator
    from agenttune.components.estimators.turns import TurnGRPOEstimator

    return [GRPOEstimator, DrGRPOEstimator, RLOOEstimator, ReinforcePlusPlusBaselineEstimator, TurnGRPOEstimator,
            RejectionSamplingEstimator]


@hookimpl
def register_policy_losses():
    from agenttune.components.losses.distillation import DistillationLoss
    from agenttune.components.losses.policy_gradient import CISPOLoss, GSPOLoss, PPOClipLoss
    from agenttune.components.losses.supervised import CrossEntropyLoss

    return [PPOClipLoss, GSPOLoss, CISPOLoss, CrossEntropyLoss, DistillationLoss]
