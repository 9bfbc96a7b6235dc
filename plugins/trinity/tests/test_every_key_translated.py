"""No option silently dropped: every agenttune config key, set alone to a non-default value, either
changes the Trinity-RFT config the plugin generates or is refused before the run by a `UserError` that
names it — or is in `NOT_FOR_TRINITY` below, with the reason it need not reach Trinity's config.

The walk covers every leaf of `config_model()` (the core's sections and the installed plugins'); a new
key fails here until it is translated, refused or listed with its reason.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from agenttune_trinity.backbone import TrinityBackbone
from agenttune_trinity.launch import write_tasksets

from agenttune.plugin_api import UserError, apply_overrides, build_config
from agenttune.testing.config_walk import KeyWalk, build, set_path

BASE: dict[str, Any] = {
    "backbone": "trinity",
    "workflow": "agenttune.testing.agents:CalculatorWorkflow",
    "model": {"path": "/models/policy"},
    "trainer": {"n_gpus_per_node": 4},
}

# Keys whose type gives no non-default value (strings, optional values, lists, dicts), or whose generic
# value would not exercise them; several values where each means something else.
VALUES: dict[str, list[Any]] = {
    # Several policies (docs/multi_policy.md): refused, each key with the others it needs to be valid.
    "policies.adapters": [{"writer": {"rank": 4}}],
    "policies.agents": [{"default": "writer"}],
    "policies.default_policy": ["writer"],
    "policies.reward": ["per_agent"],
    "project_name": ["proj"],
    "experiment_name": ["exp"],
    "workflow": ["my_agents:OtherWorkflow"],
    "agent_framework": ["agentscope"],
    "backbone": ["local"],
    "task_reader.type": ["huggingface"],
    "task_reader.train_split": ["training"],
    "task_reader.validation_split": ["test"],
    "judge.type": ["llm_judge"],
    "judge.judge_protocol": ["my_judges:Judge"],
    "model.path": ["/models/other"],
    "model.tokenizer": ["/models/tokenizer"],
    "engine.type": ["vllm", "openai", "scripted"],
    "gateway.host": ["0.0.0.0"],
    "gateway.tool_parser": ["qwen3_coder"],
    "gateway.reasoning_parser": [None],
    "gateway.allowed_hosts": [["example.org"]],
    "rollout.max_env_worker": [32],
    "rollout.top_p": [0.9],
    "rollout.top_k": [50],
    "rollout.context_overflow_reward": [-1.0],
    "rollout.turn_limit_reward": [-1.0],
    "rollout.compute_madness_checklist": [["nonsense"]],
    "rollout.trainable_targets": [["solver"]],
    "data.val_batch_size": [16],
    "data.max_prompt_length": [1024],
    "data.max_response_length": [2048],
    "algorithm.adv_estimator": ["dr_grpo", "rloo", "reinforce_plus_plus_baseline", "turn_grpo", "rejection_sampling"],
    "algorithm.estimator_options": [{"norm_by_std": False}],
    "algorithm.policy_loss": ["gspo", "cispo", "cross_entropy"],
    "algorithm.policy_loss_options": [{"teacher": "/models/other_teacher"}],
    "algorithm.rollout_correction.rollout_is_threshold": [3.0, "0.5_2.0"],
    "algorithm.rollout_correction.rollout_rs": ["token_k1", "seq_sum_k1"],
    "algorithm.rollout_correction.rollout_rs_threshold": ["0.8_1.25"],
    "trainer.total_steps": [10],
    "trainer.n_gpus_per_node": [8],
    "trinity": [{"explorer": {"runner_per_model": 3}}],
    # the local and debug backbones' own sections (not read here: see NOT_FOR_TRINITY)
    "local.gradient_checkpointing": [True],
    "local.update_threads": [2],
    "local.lora_target_modules": [["q_proj"]],
    "local.warmup.data": ["warmup.jsonl"],
}

# Trinity's own rule for off-policy tokens (the engine's log-probs as π_old), which the asynchronous modes need
# here: Trinity has no importance-sampling correction, so their default (TIS) is refused.
BYPASS = {"algorithm.rollout_correction.bypass_mode": True}
VALIDATING = {"task_reader.validation_split": "test", "trainer.test_freq": 5}

# What a key needs around it to mean anything (e.g. a threshold needs its criterion): the walk compares
# the config with the context against the same config with the key's value on top.
CONTEXT: dict[str, dict[str, Any]] = {
    "policies.adapters": {"policies.agents": {"default": "writer"}},
    "policies.agents": {"policies.adapters": {"writer": {"rank": 4}}},
    "policies.default_policy": {"policies.adapters": {"writer": {"rank": 4}}},
    "policies.reward": {"policies.adapters": {"writer": {"rank": 4}}, "policies.agents": {"default": "writer"}},
    "algorithm.kl_estimator": {"algorithm.kl_coef": 0.01},
    "algorithm.dynamic_sampling.max_retries": {"algorithm.dynamic_sampling.enable": True},
    "algorithm.policy_loss_options": {"algorithm.policy_loss": "distillation",
                                      "algorithm.policy_loss_options": {"teacher": "/models/teacher"}},
    "algorithm.rollout_correction.rollout_is_threshold": {"algorithm.rollout_correction.rollout_is": "token"},
    "algorithm.rollout_correction.rollout_is_batch_normalize": {"algorithm.rollout_correction.rollout_is": "token"},
    "algorithm.rollout_correction.rollout_rs": {"algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
    "algorithm.rollout_correction.rollout_rs_threshold": {"algorithm.rollout_correction.rollout_rs": "seq_mean_k1",
                                                          "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
    "algorithm.rollout_correction.loss_type": {"algorithm.rollout_correction.bypass_mode": True,
                                               "algorithm.rollout_correction.rollout_is": "token"},
    "trainer.max_staleness": {"trainer.mode": "async", **BYPASS},
    "trainer.test_freq": {"task_reader.validation_split": "test"},
    "trainer.val_before_train": {"task_reader.validation_split": "test"},
    "rollout.val_temperature": VALIDATING,
}

# A value that means what the base config already does on Trinity, so the generated config rightly stays.
SAME_AS_BASE: dict[tuple[str, Any], str] = {
    ("model.dtype", "bfloat16"): "model.dtype auto is bfloat16 for Trinity's GPU rollouts",
    ("engine.type", "vllm"): "Trinity's rollout engines are always vLLM (explorer.rollout_model.engine_type); hf "
                             "is the default, other engines are refused (test_engines_trinity_cannot_use_are_refused)",
    ("task_reader.validation_split", "test"): "nothing validates without trainer.test_freq or val_before_train, "
                                              "on any backbone; with them (their cases here) it is eval_tasksets",
}

# Keys that legitimately do not reach Trinity's config, by group, with the reason.
NOT_FOR_TRINITY: dict[str, str] = {
    # Read by agenttune's workflow inside Trinity's workflow runners: it loads <run_dir>/config.yaml and runs
    # each task's group through agenttune's rollout stack (gateway, workflow, judge) on Trinity's vLLM engine
    # (stack.py). model.tokenizer: the gateway renders prompts with it; Trinity trains on the ids it hands over.
    **dict.fromkeys([
        "workflow", "agent_framework", "model.tokenizer",
        "judge.type", "judge.judge_protocol", "judge.always_run", "judge.isolation", "judge.workers",
        "judge.memory_limit_mb",
        "gateway.host", "gateway.port", "gateway.tool_parser", "gateway.reasoning_parser", "gateway.max_body_mib",
        "gateway.request_timeout_s", "gateway.keep_alive_timeout_s", "gateway.max_connections",
        "gateway.allowed_hosts",
        "rollout.workflow_processes", "rollout.max_turns", "rollout.agent_madness_reward",
        "rollout.context_overflow_reward", "rollout.turn_limit_reward", "rollout.compute_madness_checklist",
        "rollout.trainable_targets",
    ], "read by agenttune's workflow inside Trinity's workflow runners (its rollout stack: gateway, workflow, judge)"),
    # Applied by agenttune's workflow when it turns an episode into Experiences (experiences.py): samples split at
    # call boundaries to the length limits, DAPO's overlong penalty subtracted from the reward.
    **dict.fromkeys(["data.max_prompt_length", "data.max_response_length", "algorithm.overlong_shaping.enable",
                     "algorithm.overlong_shaping.max_length", "algorithm.overlong_shaping.buffer",
                     "algorithm.overlong_shaping.penalty"],
                    "applied by agenttune's workflow to the Experiences it hands Trinity (experiences.py)"),
    # Read when agenttune writes the tasksets Trinity reads (launch.write_tasksets): their rows, not a config key
    # (data.val_batch_size: the first N validation tasks, as the local backbone validates on;
    # test_val_batch_size_limits_the_validation_taskset below).
    **dict.fromkeys(["task_reader.type", "task_reader.train_split", "task_reader.read_timeout",
                     "data.val_batch_size"],
                    "read when agenttune writes Trinity's tasksets (launch.write_tasksets)"),
    "backbone": "selects this backbone (--backbone trinity)",
}
# And every key of the other built-in backbones' sections, `local:` and `debug:` (config_walk.OTHER_BACKBONES):
# options of their own trainers, which a Trinity run never starts.


def translate(config: Any) -> dict[str, Any]:
    TrinityBackbone.check(config)
    return TrinityBackbone.native_config(config)


WALK = KeyWalk("Trinity", BASE, translate, values=VALUES, context=CONTEXT, same_as_base=SAME_AS_BASE,
               not_for=NOT_FOR_TRINITY)
CASES = WALK.cases()


def test_the_walk_covers_every_key():
    WALK.check_tables()


@pytest.mark.parametrize(("key", "value"), CASES, ids=[f"{key}={value!r}" for key, value in CASES])
def test_every_key_reaches_trinity_or_is_refused(key: str, value: Any):
    WALK.check(key, value)


def with_overrides(**dotted: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for key, value in dotted.items():
        set_path(data, key.replace("__", "."), value)
    return data


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_issue_example_asynchronous_correction_is_refused_not_dropped(mode: str):
    """The issue's example: `--backbone trinity trainer.mode=one_step_off algorithm.rollout_correction.rollout_is=token`
    was accepted and the generated config carried no correction. Trinity-RFT 0.6.0 has none to carry, so it is
    refused in one paragraph naming the key and what to do, and so is the asynchronous modes' default TIS."""
    # as the user typed it: `--backbone trinity trainer.mode=... algorithm.rollout_correction.rollout_is=token`
    explicit = build_config(copy.deepcopy(BASE), apply_overrides(
        {}, [f"trainer.mode={mode}", "algorithm.rollout_correction.rollout_is=token"]))
    with pytest.raises(UserError) as raised:
        translate(explicit)
    message = raised.value.render()
    assert "algorithm.rollout_correction.rollout_is='token'" in message
    assert "bypass_mode: true" in message and "--backbone local or verl" in message
    assert "\n" not in message

    default = build(with_overrides(trainer__mode=mode))  # the section left unset: the asynchronous default TIS
    assert default.algorithm.rollout_correction.rollout_is == "token"
    with pytest.raises(UserError, match=f"trainer.mode='{mode}' uses token-level truncated importance sampling"):
        translate(default)

    # what the message and the README say to do instead is accepted, and says bypass explicitly
    instead = build_config(copy.deepcopy(BASE), apply_overrides(
        {}, [f"trainer.mode={mode}", "algorithm.rollout_correction.bypass_mode=true"]))
    assert translate(instead)["algorithm"]["bypass_old_logprobs"] is True


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "async"])
def test_bypass_mode_is_trinitys_own_rule(mode: str):
    """bypass_mode (ppo_clip): π_old is the engine's log-probs, as Trinity's trainer takes it
    (algorithm.bypass_old_logprobs); without it nothing is said and Trinity's default (the same) applies."""
    native = translate(build(with_overrides(trainer__mode=mode, algorithm__rollout_correction__bypass_mode=True)))
    assert native["algorithm"]["bypass_old_logprobs"] is True
    assert "rollout_correction" not in native["algorithm"]
    native = translate(build(with_overrides(algorithm__rollout_correction__rollout_is=None)))
    assert "bypass_old_logprobs" not in native["algorithm"]


def test_engines_trinity_cannot_use_are_refused():
    for engine in ({"type": "openai"}, {"type": "scripted"}, {"type": "vllm", "gpu_memory_utilization": 0.5}):
        with pytest.raises(UserError, match=r"engine\."):
            translate(build({**BASE, "engine": engine}))
    for engine in ({"type": "hf"}, {"type": "vllm"}):
        translate(build({**BASE, "engine": engine}))


class _Components:
    """What write_tasksets reads from the resolved components: the tasks of a split."""

    def __init__(self) -> None:
        from agenttune.plugin_api import Task

        self.tasks = {split: [Task(task_id=f"{split}-{i}", query=f"q{i}") for i in range(6)]
                      for split in ("train", "test")}

    def read_tasks(self, split: str, limit: int | None = None) -> Any:
        return iter(self.tasks[split][:limit])


def test_val_batch_size_limits_the_validation_taskset(tmp_path: Path):
    """data.val_batch_size: N validates on the first N tasks of the split, as the local backbone does."""
    config = build(with_overrides(task_reader__validation_split="test", trainer__test_freq=1,
                                  data__train_batch_size=2, data__val_batch_size=4))
    write_tasksets(_Components(), config, tmp_path)  # type: ignore[arg-type]
    lines = (tmp_path / "validation.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["task_id"] for line in lines] == ["test-0", "test-1", "test-2", "test-3"]
    assert len((tmp_path / "train.jsonl").read_text(encoding="utf-8").splitlines()) == 6
