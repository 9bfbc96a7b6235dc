"""The plugin kinds: one contract each, beside the built-ins that implement it.

    readers/      task readers       contract readers/base.py (TaskReader); file, huggingface, in_memory
    judges/       judges             contract judges/base.py (Judge); llm_judge
    engines/      inference engines  contract engines/base.py (InferenceEngine); hf, vllm, openai,
                                     scripted; model loading and the tiny model
    frameworks/   agent frameworks   contract frameworks/base.py (AgentFramework); openai
    parsers/      reply parsers      contract parsers/base.py (ToolParser, ReasoningParser); hermes, think
    estimators/   advantage estimators  contract estimators/base.py; grpo and its kin, turn_grpo, rejection
    losses/       policy losses      contract losses/base.py (PolicyLoss); ppo_clip, gspo, cispo, ...
    backbone.py   the Backbone contract (the built-in backbones run rollouts, so they live above, in
                  agenttune/backbones/)

Each component is a `config.base.Component`: a `name` the config selects and an `Options` model.
Nothing here imports the registry, the gateway or the rollout engine.
"""
