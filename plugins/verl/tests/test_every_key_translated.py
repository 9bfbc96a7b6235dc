"""No option silently dropped: every agenttune config key, set alone to a non-default value, either
changes the verl config the plugin generates or is refused before the run by a `UserError` that names
it — or is in `NOT_FOR_VERL` below, with the reason it need not reach verl's config.

The walk covers every leaf of `config_model()` (the core's sections and the installed plugins'); a new
key fails here until it is translated, refused or listed with its reason.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any

import pytest
from agenttune_verl.backbone import VerlBackbone
from agenttune_verl.launch import write_datasets
from agenttune_verl.translation import VerlPaths

from agenttune.plugin_api import UserError
from agenttune.testing.config_walk import KeyWalk, build

BASE: dict[str, Any] = {
    "backbone": "verl",
    "workflow": "agenttune.testing.agents:CalculatorWorkflow",
    "model": {"path": "/models/policy"},
    "trainer": {"n_gpus_per_node": 4},
}

# Keys whose type gives no non-default value (strings, optional values, lists, dicts), or whose generic
# value would not exercise them; several values where each means something else.
VALUES: dict[str, list[Any]] = {
    # Policies (docs/multi_policy.md): one is verl's LoRA (policies.py), each key walked from a valid one-policy
    # config (its CONTEXT): another rank reaches verl; no default policy, or per-agent rewards, are refused.
    "policies.adapters": [{"writer": {"rank": 8}}],
    "policies.agents": [{"solver": "writer"}],
    "policies.default_policy": [None],
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
    "ray.address": ["auto"],
    "verl": [{"trainer": {"balance_batch": False}}],
    # the local and debug backbones' own sections (not read here: see NOT_FOR_VERL)
    "local.gradient_checkpointing": [True],
    "local.update_threads": [2],
    "local.lora_target_modules": [["q_proj"]],
    "local.warmup.data": ["warmup.jsonl"],
}

# What a key needs around it to mean anything (e.g. a threshold needs its criterion): the walk compares
# the config with the context against the same config with the key's value on top.
CONTEXT: dict[str, dict[str, Any]] = {
    **dict.fromkeys(["policies.adapters", "policies.agents", "policies.reward"],
                    {"policies.adapters": {"writer": {"rank": 4}}, "policies.default_policy": "writer"}),
    "policies.default_policy": {"policies.adapters": {"writer": {"rank": 4}}, "policies.default_policy": "writer",
                                "policies.agents": {"solver": "writer"}},
    "algorithm.kl_estimator": {"algorithm.kl_coef": 0.01},
    "algorithm.dynamic_sampling.max_retries": {"algorithm.dynamic_sampling.enable": True},
    "algorithm.policy_loss_options": {"algorithm.policy_loss": "distillation",
                                      "algorithm.policy_loss_options": {"teacher": "/models/teacher"},
                                      "verl": {"distillation": {"nnodes": 1}}},
    "algorithm.rollout_correction.rollout_is_threshold": {"algorithm.rollout_correction.rollout_is": "token"},
    "algorithm.rollout_correction.rollout_is_batch_normalize": {"algorithm.rollout_correction.rollout_is": "token"},
    "algorithm.rollout_correction.rollout_rs": {"algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
    "algorithm.rollout_correction.rollout_rs_threshold": {"algorithm.rollout_correction.rollout_rs": "seq_mean_k1",
                                                          "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
    "algorithm.rollout_correction.loss_type": {"algorithm.rollout_correction.bypass_mode": True,
                                               "algorithm.rollout_correction.rollout_is": "token"},
    "trainer.max_staleness": {"trainer.mode": "async"},
    "trainer.test_freq": {"task_reader.validation_split": "test"},
    "trainer.val_before_train": {"task_reader.validation_split": "test"},
}

# A value that means what the base config already does on verl, so the generated config rightly stays.
SAME_AS_BASE: dict[tuple[str, Any], str] = {
    ("model.dtype", "bfloat16"): "model.dtype auto is bfloat16 for verl's GPU rollouts",
    ("engine.type", "vllm"): "verl's rollout is always vLLM (actor_rollout_ref.rollout.name: vllm); hf is the "
                             "default, other engines are refused (test_engines_verl_cannot_use_are_refused)",
}

# Keys that legitimately do not reach verl's config, by group, with the reason.
NOT_FOR_VERL: dict[str, str] = {
    # Read by agenttune's agent loop inside verl's agent-loop workers: it loads <run_dir>/config.yaml and runs
    # the episode through agenttune's rollout stack (gateway, workflow, judge) on verl's servers (agent_loop.py).
    **dict.fromkeys([
        "workflow", "agent_framework",
        "judge.type", "judge.judge_protocol", "judge.always_run", "judge.timeout", "judge.isolation", "judge.workers",
        "judge.memory_limit_mb",
        "gateway.host", "gateway.port", "gateway.tool_parser", "gateway.reasoning_parser", "gateway.max_body_mib",
        "gateway.request_timeout_s", "gateway.keep_alive_timeout_s", "gateway.max_connections",
        "gateway.allowed_hosts",
        "rollout.max_env_worker", "rollout.workflow_processes", "rollout.max_turns", "rollout.episode_timeout",
        "rollout.agent_madness_reward", "rollout.context_overflow_reward", "rollout.turn_limit_reward",
        "rollout.compute_madness_checklist", "rollout.trainable_targets",
    ], "read by agenttune's agent loop inside verl's agent-loop workers (its rollout stack: gateway, workflow, judge)"),
    # DAPO's overlong penalty is subtracted by the agent loop from the reward it hands verl (outputs.py).
    **dict.fromkeys(["algorithm.overlong_shaping.enable", "algorithm.overlong_shaping.max_length",
                     "algorithm.overlong_shaping.buffer", "algorithm.overlong_shaping.penalty"],
                    "applied by agenttune's agent loop to the reward it hands verl (outputs.py)"),
    # Read when agenttune writes the tasks for verl (launch.write_datasets): the rows of train.parquet and
    # validation.parquet, not a config key (data.val_batch_size: the first N validation tasks, as the local
    # backbone validates on; test_val_batch_size_limits_the_validation_file below).
    **dict.fromkeys(["task_reader.type", "task_reader.train_split", "task_reader.read_timeout",
                     "data.val_batch_size"],
                    "read when agenttune writes verl's dataset files (launch.write_datasets)"),
    "policies.agents": "with one policy every agent samples it (policies.default_policy must name it: policies.py); "
                       "several policies are refused",
    "backbone": "selects this backbone (--backbone verl)",
    "ray.address": "the Ray cluster the launcher joins; verl's trainer gets it as RAY_ADDRESS (launch.py)",
}
# And every key of the other built-in backbones' sections, `local:` and `debug:` (config_walk.OTHER_BACKBONES):
# options of their own trainers, which a verl run never starts.


@pytest.fixture(autouse=True, scope="module")
def _compose_once():
    """verl's own Hydra files compose to the same base every time: compose them once for the walk."""
    from agenttune_verl import verl_config

    base = verl_config.compose_verl_base()
    original = verl_config.compose_verl_base
    verl_config.compose_verl_base = lambda: copy.deepcopy(base)
    yield
    verl_config.compose_verl_base = original


def translate(config: Any) -> dict[str, Any]:
    VerlBackbone.check(config)
    return VerlBackbone.native_config(config)


# The AgentScope plugin's section, where it is installed (the verl session installs it for the README's math
# agent): the framework's own options, read by the workflow's agents in verl's agent-loop workers.
if importlib.util.find_spec("agenttune_agentscope") is not None:
    VALUES |= {"agentscope.context_size": [4096], "agentscope.stream": [True]}
    NOT_FOR_VERL |= dict.fromkeys(
        ["agentscope.stream", "agentscope.headless", "agentscope.permission_mode", "agentscope.inject_runtime_state",
         "agentscope.context_size"],
        "the AgentScope framework's options, read by agenttune's agent loop inside verl's agent-loop workers")

WALK = KeyWalk("verl", BASE, translate, values=VALUES, context=CONTEXT, same_as_base=SAME_AS_BASE,
               not_for=NOT_FOR_VERL)
CASES = WALK.cases()


def test_the_walk_covers_every_key():
    WALK.check_tables()


@pytest.mark.parametrize(("key", "value"), CASES, ids=[f"{key}={value!r}" for key, value in CASES])
def test_every_key_reaches_verl_or_is_refused(key: str, value: Any):
    WALK.check(key, value)


def test_issue_example_one_step_off_correction_reaches_verl():
    config = build({**BASE, "trainer": {**BASE["trainer"], "mode": "one_step_off"},
                    "algorithm": {"rollout_correction": {"rollout_is": "sequence"}}})
    correction = translate(config)["algorithm"]["rollout_correction"]
    assert (correction["rollout_is"], correction["rollout_is_threshold"]) == ("sequence", 2.0)
    # and the asynchronous modes' default TIS, when the section is left unset
    config = build({**BASE, "trainer": {**BASE["trainer"], "mode": "one_step_off"}})
    correction = translate(config)["algorithm"]["rollout_correction"]
    assert (correction["rollout_is"], correction["rollout_is_threshold"]) == ("token", 2.0)


def test_engines_verl_cannot_use_are_refused():
    for engine in ({"type": "openai"}, {"type": "scripted"}, {"type": "vllm", "gpu_memory_utilization": 0.5}):
        with pytest.raises(UserError, match=r"engine\."):
            translate(build({**BASE, "engine": engine}))
    for engine in ({"type": "hf"}, {"type": "vllm"}):
        translate(build({**BASE, "engine": engine}))


class _Components:
    """What write_datasets reads from the resolved components: the tasks of a split."""

    def __init__(self) -> None:
        from agenttune.plugin_api import Task

        self.tasks = {split: [Task(task_id=f"{split}-{i}", query=f"q{i}") for i in range(6)]
                      for split in ("train", "test")}
        self.limits: dict[str, int | None] = {}

    def read_tasks(self, split: str, limit: int | None = None) -> Any:
        self.limits[split] = limit
        return iter(self.tasks[split][:limit])


def test_val_batch_size_limits_the_validation_file(tmp_path):
    """data.val_batch_size: N validates on the first N tasks of the split, as the local backbone does."""
    import pyarrow.parquet as pq

    config = build({**BASE, "task_reader": {"validation_split": "test"}, "data": {"train_batch_size": 2,
                                                                                   "val_batch_size": 4}})
    paths = VerlPaths.for_run(tmp_path, has_validation=True)
    components = _Components()
    write_datasets(config, components, paths)  # type: ignore[arg-type]
    assert pq.read_table(paths.val_files).num_rows == 4
    assert components.limits == {"train": None, "test": 4}  # the reader is asked for no more than it needs
    assert pq.read_table(paths.train_files).num_rows == 6
