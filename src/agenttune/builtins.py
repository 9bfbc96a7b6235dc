"""agenttune's own components, registered through the same hooks as any plugin.

Each hook imports only the modules that define its classes; those modules keep heavy libraries
(torch, transformers) inside functions, so listing plugins stays fast.
"""

from __future__ import annotations

from agenttune.hookspecs import hookimpl


@hookimpl
def register_task_readers():
    from agenttune.readers.file import FileTaskReader
    from agenttune.readers.huggingface import HuggingFaceTaskReader
    from agenttune.readers.in_memory import InMemoryTaskReader

    return [FileTaskReader, HuggingFaceTaskReader, InMemoryTaskReader]


@hookimpl
def register_agent_frameworks():
    from agenttune.frameworks.openai import OpenAIFramework

    return [OpenAIFramework]


@hookimpl
def register_judges():
    from agenttune.judges.llm_judge import LLMJudge

    return [LLMJudge]


@hookimpl
def register_backbones():
    from agenttune.backbones.debug import DebugBackbone
    from agenttune.backbones.local import LocalBackbone

    return [DebugBackbone, LocalBackbone]


@hookimpl
def register_engines():
    from agenttune.engines.hf import HFEngine
    from agenttune.engines.openai import OpenAIEngine
    from agenttune.engines.scripted import ScriptedEngine
    from agenttune.engines.vllm import VLLMEngine

    return [HFEngine, OpenAIEngine, ScriptedEngine, VLLMEngine]


@hookimpl
def register_tool_parsers():
    from agenttune.parsers.hermes import HermesToolParser

    return [HermesToolParser]


@hookimpl
def register_reasoning_parsers():
    from agenttune.parsers.think import ThinkParser

    return [ThinkParser]


@hookimpl
def register_advantage_estimators():
    from agenttune.estimators.outcome import (
        DrGRPOEstimator,
        GRPOEstimator,
        ReinforcePlusPlusBaselineEstimator,
        RLOOEstimator,
    )
    from agenttune.estimators.rejection import RejectionSamplingEstimator
    from agenttune.estimators.turns import TurnGRPOEstimator

    return [GRPOEstimator, DrGRPOEstimator, RLOOEstimator, ReinforcePlusPlusBaselineEstimator, TurnGRPOEstimator,
            RejectionSamplingEstimator]


@hookimpl
def register_policy_losses():
    from agenttune.losses.distillation import DistillationLoss
    from agenttune.losses.policy_gradient import CISPOLoss, GSPOLoss, PPOClipLoss
    from agenttune.losses.supervised import CrossEntropyLoss

    return [PPOClipLoss, GSPOLoss, CISPOLoss, CrossEntropyLoss, DistillationLoss]
