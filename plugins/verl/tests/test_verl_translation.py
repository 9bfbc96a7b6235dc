"""The agenttune -> verl config translation, checked against verl 0.9.1's own Hydra config files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from agenttune_verl.backbone import VerlBackbone, config_problems
from agenttune_verl.translation import SAVE_ONLY_AT_END, TRANSLATIONS, VerlPaths, translated_values
from agenttune_verl.verl_config import build_verl_config, compose_verl_base, has_key, resolved
from omegaconf import OmegaConf

from agenttune.plugin_api import AgentTuneConfig, UserError, config_model

# One non-default agenttune config, and what every row of the translation table must make of it.
CUSTOM = {
    "project_name": "proj",
    "experiment_name": "exp",
    "model": {"path": "/models/qwen", "tokenizer": "/models/tok", "trust_remote_code": True,
              "max_model_len": 24576, "dtype": "float16"},
    "algorithm": {"norm_adv_by_std": False, "kl_coef": 0.01, "kl_estimator": "k1", "clip_ratio_low": 0.1,
                  "clip_ratio_high": 0.28, "loss_agg_mode": "seq-mean-token-mean",
                  "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": "0.5_3.0",
                                         "rollout_is_batch_normalize": True, "rollout_rs": "seq_mean_k1",
                                         "rollout_rs_threshold": "0.9_1.1"}},
    "trainer": {"learning_rate": 3e-6, "lr_schedule": "cosine", "warmup_steps": 5, "weight_decay": 0.1,
                "grad_clip": 0.5, "total_epochs": 3, "total_steps": 40, "save_freq": 10, "test_freq": 5,
                "val_before_train": True, "seed": 7, "n_gpus_per_node": 4, "nnodes": 2},
    "data": {"train_batch_size": 32, "max_prompt_length": 1024, "max_response_length": 20000, "shuffle": False},
    "rollout": {"num_repeat": 8, "temperature": 0.9, "top_p": 0.95, "top_k": 50, "val_temperature": 0.6},
    "monitor": {"tensorboard": True, "wandb": True, "swanlab": False},
    "task_reader": {"validation_split": "test"},
}
PATHS = VerlPaths("/run/train.parquet", "/run/val.parquet", "/run/loops.yaml", "/run/checkpoints")
EXPECTED = {
    "algorithm.adv_estimator": "grpo",
    "algorithm.norm_adv_by_std_in_grpo": False,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "algorithm.filter_groups.enable": False,
    "algorithm.filter_groups.metric": "reward",
    "algorithm.filter_groups.max_num_gen_batches": 5,
    "algorithm.use_kl_in_reward": False,
    "critic.enable": False,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.01,
    "actor_rollout_ref.actor.kl_loss_type": "k1",
    "actor_rollout_ref.actor.clip_ratio_low": 0.1,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
    "actor_rollout_ref.model.path": "/models/qwen",
    "actor_rollout_ref.model.tokenizer_path": "/models/tok",
    "actor_rollout_ref.model.trust_remote_code": True,
    "data.trust_remote_code": True,
    "actor_rollout_ref.actor.optim.lr": 3e-6,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 5,
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.optim.clip_grad": 0.5,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 21024,
    "actor_rollout_ref.actor.data_loader_seed": 7,
    "data.train_files": "/run/train.parquet",
    "data.val_files": "/run/val.parquet",
    "data.train_batch_size": 32,
    "data.max_prompt_length": 1024,
    "data.max_response_length": 20000,
    "data.shuffle": False,
    "data.seed": 7,
    "data.return_raw_chat": True,
    "data.filter_overlong_prompts": False,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.mode": "async",
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.temperature": 0.9,
    "actor_rollout_ref.rollout.top_p": 0.95,
    "actor_rollout_ref.rollout.top_k": 50,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 0.6,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
    "actor_rollout_ref.rollout.calculate_log_probs": True,
    "actor_rollout_ref.rollout.max_model_len": 24576,
    "actor_rollout_ref.rollout.dtype": "float16",
    "actor_rollout_ref.rollout.seed": 7,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.agent.default_agent_loop": "agenttune",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "/run/loops.yaml",
    "trainer.project_name": "proj",
    "trainer.experiment_name": "exp",
    "trainer.total_epochs": 3,
    "trainer.total_training_steps": 40,
    "trainer.save_freq": 10,
    "trainer.test_freq": 5,
    "trainer.val_before_train": True,
    "trainer.n_gpus_per_node": 4,
    "trainer.nnodes": 2,
    "trainer.logger": ["console", "file", "tensorboard", "wandb"],
    "trainer.default_local_dir": "/run/checkpoints",
    "trainer.use_v1": True,
    "algorithm.rollout_correction.rollout_is": "token",
    "algorithm.rollout_correction.rollout_is_threshold": "0.5_3.0",
    "algorithm.rollout_correction.rollout_is_batch_normalize": True,
    "algorithm.rollout_correction.rollout_rs": "seq_mean_k1",
    "algorithm.rollout_correction.rollout_rs_threshold": "0.9_1.1",
    "algorithm.rollout_correction.bypass_mode": False,
    "algorithm.rollout_correction.loss_type": "ppo_clip",
    "trainer.v1.trainer_mode": "sync",
    "trainer.v1.sampler.max_off_policy_threshold": None,
    "trainer.v1.sampler.max_off_policy_strategy": "drop",
    "trainer.v1.colocate_async.num_warmup_batches": 0,
    "trainer.v1.separate_async.num_warmup_batches": 0,
    "trainer.v1.separate_async.parameter_sync_step": 1,
}


def config_with(**sections: Any) -> AgentTuneConfig:
    """A config made in Python with the installed plugins' sections (this plugin's `verl:` and `ray:`)."""
    return config_model()(**sections)


@pytest.fixture(scope="module")
def verl_base():
    return compose_verl_base()


def test_key_lookup_sees_mandatory_unset_values(verl_base):
    assert OmegaConf.is_missing(verl_base.actor_rollout_ref.rollout, "name")  # `???` in rollout.yaml
    assert has_key(verl_base, "actor_rollout_ref.rollout.name")
    assert not has_key(verl_base, "actor_rollout_ref.rollout.no_such_key")
    assert not has_key(verl_base, "no_such_section.key")


def test_every_translated_key_exists_in_verls_own_config(verl_base):
    missing = [row.verl_key for row in TRANSLATIONS if not has_key(verl_base, row.verl_key)]
    assert missing == []
    assert len({row.verl_key for row in TRANSLATIONS}) == len(TRANSLATIONS), "a verl key is set twice"


def test_the_translation_table_is_covered():
    values = translated_values(config_with(**CUSTOM), PATHS)
    assert set(values) == set(EXPECTED), "every row of the table needs an expectation here"
    assert values == EXPECTED


@pytest.mark.parametrize(("overrides", "key", "expected"), [
    ({}, "actor_rollout_ref.actor.use_kl_loss", False),  # kl_coef 0: no reference model
    ({}, "trainer.save_freq", SAVE_ONLY_AT_END),  # 0: only at the end
    ({}, "trainer.test_freq", -1),  # 0: never during training
    ({}, "actor_rollout_ref.rollout.val_kwargs.do_sample", False),  # greedy validation
    ({}, "actor_rollout_ref.rollout.dtype", "bfloat16"),  # dtype auto
    ({}, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384),  # verl's default when sequences fit
    ({"trainer": {"n_gpus_per_node": 1}}, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1),
    ({"monitor": {"tensorboard": False}}, "trainer.logger", ["console", "file"]),
    ({}, "algorithm.rollout_correction.rollout_is", None),  # off unless asked for: verl's yaml default too
    # asynchronous training: verl's V1 colocate_async trainer; its bound counts versions spanned (lag + 1)
    ({"trainer": {"mode": "one_step_off"}}, "trainer.v1.trainer_mode", "colocate_async"),
    ({"trainer": {"mode": "one_step_off", "max_staleness": 5}}, "trainer.v1.sampler.max_off_policy_threshold", 2),
    ({"trainer": {"mode": "one_step_off"}}, "trainer.v1.colocate_async.num_warmup_batches", 1),
    ({"trainer": {"mode": "async", "max_staleness": 3}}, "trainer.v1.trainer_mode", "colocate_async"),
    ({"trainer": {"mode": "async", "max_staleness": 3}}, "trainer.v1.sampler.max_off_policy_threshold", 4),
    ({"trainer": {"mode": "async", "max_staleness": 3}}, "trainer.v1.colocate_async.num_warmup_batches", 3),
    ({"trainer": {"mode": "async", "max_staleness": 0}}, "trainer.v1.sampler.max_off_policy_threshold", 1),
])
def test_translation_defaults(overrides, key, expected):
    assert translated_values(config_with(**overrides), PATHS)[key] == expected


def test_generated_config_passes_verls_own_validation(tiny_model_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    config = config_with(**{**CUSTOM, "model": {"path": str(tiny_model_path), "max_model_len": 24576}})
    verl_config = build_verl_config(config, PATHS)
    validate_config(verl_config, use_reference_policy=need_reference_policy(verl_config),
                    use_critic=need_critic(verl_config))
    assert need_reference_policy(verl_config) and not need_critic(verl_config)
    rollout = omega_conf_to_dataclass(verl_config.actor_rollout_ref.rollout)
    assert (rollout.n, rollout.prompt_length, rollout.response_length) == (8, 1024, 20000)
    model = omega_conf_to_dataclass(verl_config.actor_rollout_ref.model)
    assert model.tokenizer is not None  # verl loaded the tiny model's tokenizer from model.path
    actor = omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor)
    assert actor.optim.lr == 3e-6 and actor.optim.clip_grad == 0.5


def test_passthrough_is_applied_verbatim_last(verl_base):
    config = config_with(verl={
        "actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.7, "n": 16}},
        "trainer.balance_batch": False,
        "+actor_rollout_ref.rollout.engine_kwargs.vllm": {"swap_space": 4},
    })
    verl_config = resolved(build_verl_config(config, PATHS))
    rollout = verl_config["actor_rollout_ref"]["rollout"]
    assert rollout["gpu_memory_utilization"] == 0.7
    assert rollout["n"] == 16  # the verl section wins over the translation of rollout.num_repeat
    assert verl_config["actor_rollout_ref"]["actor"]["rollout_n"] == 16  # verl's own interpolation follows
    assert verl_config["trainer"]["balance_batch"] is False
    assert rollout["engine_kwargs"]["vllm"] == {"swap_space": 4}


def test_passthrough_typo_is_a_user_error_with_a_suggestion():
    config = config_with(verl={"actor_rollout_ref": {"rollout": {"gpu_memory_utilisation": 0.7}}})
    with pytest.raises(UserError) as raised:
        build_verl_config(config, PATHS)
    message = raised.value.render()
    assert "verl.actor_rollout_ref.rollout.gpu_memory_utilisation" in message
    assert "Did you mean 'actor_rollout_ref.rollout.gpu_memory_utilization'" in message
    assert '"+actor_rollout_ref.rollout.gpu_memory_utilisation"' in message


def test_native_config_is_complete_and_resolved():
    native = VerlBackbone.native_config(config_with(model={"path": "/models/qwen"}))
    assert native["data"]["train_files"] == "<run_dir>/verl/train.parquet"
    assert native["data"]["val_files"] == "<run_dir>/verl/train.parquet"  # no validation split
    # verl interpolation resolved; the limit derives from model.max_model_len (4096) - the reply budget (512)
    assert native["actor_rollout_ref"]["rollout"]["prompt_length"] == 4096 - 512
    assert native["critic"]["enable"] is False
    assert native["reward"]["reward_manager"]["name"] == "naive"  # the untouched rest of verl's config


def test_config_show_prints_the_verl_config(tmp_path, capsys):
    from agenttune.plugin_api import cli_main as main

    # No --conf: `config show` then resolves no workflow or data (with a file it checks every reference
    # a run needs, and /models/qwen does not exist here); the overrides go through the same loader.
    try:
        main(["config", "show", "--backbone", "verl", "model.path=/models/qwen", "rollout.num_repeat=5",
              "verl.trainer.balance_batch=false"])
    except SystemExit as exit_:  # click's way of finishing a command
        assert exit_.code in (0, None)
    out = capsys.readouterr().out
    verl_text = out.split("# --- generated verl config ---\n", 1)[1]
    shown = yaml.safe_load(verl_text)
    assert shown["actor_rollout_ref"]["rollout"]["n"] == 5
    assert shown["algorithm"]["adv_estimator"] == "grpo"
    assert shown["trainer"]["balance_batch"] is False


@pytest.mark.parametrize(("overrides", "words"), [
    ({"model": {"path": ""}}, "model.path is not set"),
    ({"model": {"path": "tiny://default"}}, "agenttune model init-tiny"),
    ({"trainer": {"lr_schedule": "linear"}}, "lr_schedule='linear'"),
    ({"trainer": {"n_gpus_per_node": 8}, "data": {"train_batch_size": 3}, "rollout": {"num_repeat": 2}},
     "6 episodes per step do not split evenly over 8 GPUs"),
    ({"trainer": {"test_freq": 5}}, "task_reader.validation_split is not set"),
    ({"trainer": {"n_gpus_per_node": 0}}, "verl trains on GPUs"),
])
def test_config_problems_are_user_errors(overrides, words):
    config = config_with(**{"model": {"path": "/models/qwen"}, **overrides})
    problems = config_problems(config)
    assert len(problems) == 1 and words in problems[0].render()
    with pytest.raises(UserError, match="."):
        VerlBackbone.check(config)


def test_a_valid_config_has_no_problems():
    assert config_problems(config_with(**CUSTOM)) == []


def test_placeholder_paths_are_what_a_run_writes(tmp_path: Path):
    run_paths = VerlPaths.for_run(tmp_path, has_validation=True)
    placeholder = VerlPaths.placeholder(config_with(task_reader={"validation_split": "test"}))
    for real, shown in zip((run_paths.train_files, run_paths.val_files, run_paths.agent_loop_config,
                            run_paths.checkpoints),
                           (placeholder.train_files, placeholder.val_files, placeholder.agent_loop_config,
                            placeholder.checkpoints), strict=True):
        assert real == shown.replace("<run_dir>", str(tmp_path.resolve()))


def test_the_readme_shows_the_table():
    from agenttune_verl.translation import markdown_table

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in readme


def test_listing_plugins_imports_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys\n"
            "from agenttune.plugin_api import get_plugin_manager\n"
            "assert 'verl' in get_plugin_manager().names('backbones')\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'verl', 'torch', 'ray', 'hydra', 'vllm',"
            " 'transformers', 'omegaconf'})\n"
            "print(heavy)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("mode", "max_staleness", "trainer_class"), [
    ("sync", 1, "PPOTrainerSync"),
    ("one_step_off", 1, "PPOTrainerColocateAsync"),
    ("async", 2, "PPOTrainerColocateAsync"),
])
def test_main_ppo_picks_verls_trainer_for_the_mode(tiny_model_path, mode, max_staleness, trainer_class):
    """`verl.trainer.main_ppo` (the entry point agenttune launches) picks its trainer class by
    trainer.v1.trainer_mode; verl's own validation accepts the asynchronous configs."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import validate_config

    config = config_with(**{**CUSTOM, "model": {"path": str(tiny_model_path), "max_model_len": 24576},
                                "trainer": {**CUSTOM["trainer"], "mode": mode, "max_staleness": max_staleness}})
    verl_config = build_verl_config(config, PATHS)
    validate_config(verl_config, use_reference_policy=need_reference_policy(verl_config),
                    use_critic=need_critic(verl_config))
    assert get_trainer_cls(verl_config.trainer.v1.trainer_mode).__name__ == trainer_class


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
def test_verls_replay_buffer_drops_exactly_the_groups_agenttune_calls_stale(max_staleness):
    """verl's own `ReplayBufferAsync`, built from the translated sampler keys as verl's trainer builds
    it, drops a finished group fed at step g when step s trains iff s - g > trainer.max_staleness:
    the group's first tokens came from weights of version >= g - 1, the step trains version s - 1."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    config = config_with(model={"path": "/models/qwen"}, trainer={"mode": "async", "max_staleness": max_staleness})
    v1 = build_verl_config(config, PATHS).trainer.v1
    buffer = ReplayBufferAsync(trainer_mode=v1.trainer_mode, trainer_config=v1.get(v1.trainer_mode, {}),
                               max_off_policy_threshold=v1.sampler.max_off_policy_threshold,
                               max_off_policy_strategy=v1.sampler.max_off_policy_strategy,
                               sampler_kwargs=v1.sampler.sampler_kwargs, refill_fn=lambda count: None)
    training_step = 10
    fed_at = {f"group{step}": step for step in range(1, training_step + 1)}
    buffer.finished_keys["train"] = set(fed_at)
    buffer.prompt_global_steps["train"] = dict(fed_at)

    stale = buffer._stale_terminal_keys(training_step, "train")

    assert stale == {group for group, step in fed_at.items() if training_step - step > max_staleness}
    assert len(stale) == training_step - 1 - max_staleness  # one group per step fed; the rest are kept


def test_one_step_off_is_max_staleness_one_for_verl_too():
    one_step_off = translated_values(config_with(trainer={"mode": "one_step_off", "max_staleness": 7}), PATHS)
    async_one = translated_values(config_with(trainer={"mode": "async", "max_staleness": 1}), PATHS)
    assert one_step_off == async_one


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_asynchronous_modes_on_verls_legacy_trainer_are_refused(mode):
    config = config_with(model={"path": "/models/qwen"}, trainer={"mode": mode},
                             verl={"trainer": {"use_v1": False}})
    with pytest.raises(UserError) as raised:
        VerlBackbone.check(config)
    message = raised.value.render()
    assert f"trainer.mode={mode!r}" in message and "legacy trainer" in message
    assert "Remove `trainer.use_v1: false`" in message
    # synchronous training on the legacy trainer stays possible
    VerlBackbone.check(config_with(model={"path": "/models/qwen"}, verl={"trainer.use_v1": False}))


def test_separate_async_is_one_verl_override_away():
    """verl's separate_async trainer (its own rollout GPUs) takes the translated staleness bound and
    warm-up; its assertion train_batch_size == parameter_sync_step x ppo_mini_batch_size holds."""
    config = config_with(model={"path": "/models/qwen"}, trainer={"mode": "async", "max_staleness": 2},
                             verl={"trainer.v1.trainer_mode": "separate_async"})
    verl_config = resolved(build_verl_config(config, PATHS))
    v1 = verl_config["trainer"]["v1"]
    assert v1["trainer_mode"] == "separate_async"
    assert v1["separate_async"]["num_warmup_batches"] == 2 and v1["sampler"]["max_off_policy_threshold"] == 3
    mini_batch = verl_config["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]
    assert verl_config["data"]["train_batch_size"] == v1["separate_async"]["parameter_sync_step"] * mini_batch


def test_the_plugin_owns_the_verl_and_ray_sections():
    from agenttune_verl.options import RayOptions, VerlOptions

    from agenttune.plugin_api import get_plugin_manager, load_config

    config = load_config({"verl": {"trainer.balance_batch": False}, "ray": {"address": "auto"}})
    assert config.section("verl", VerlOptions).root == {"trainer.balance_batch": False}
    assert config.section("ray", RayOptions).address == "auto"
    sections = {info.name: info.config_sections for info in get_plugin_manager().infos()}
    assert sorted(sections["verl"]) == ["ray", "verl"]  # what `agenttune plugins list` shows


ONE_POLICY = {"adapters": {"solver": {"rank": 16, "alpha": 32, "target_modules": ["q_proj", "v_proj"],
                                      "learning_rate": 2e-5, "init": "/adapters/solver"}},
              "default_policy": "solver"}


def test_one_policy_is_verls_lora_merged_before_each_sync(tiny_model_path):
    config = config_with(**{**CUSTOM, "policies": ONE_POLICY})
    values = translated_values(config, PATHS)
    lora = {key.rsplit(".", 1)[1]: values[key] for key in values if key.startswith("actor_rollout_ref.model.lora")
            or key == "actor_rollout_ref.model.target_modules"}
    assert lora == {"lora_rank": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"],
                    "lora_adapter_path": "/adapters/solver", "merge": True}
    assert values["actor_rollout_ref.actor.optim.lr"] == 2e-5  # the policy's own learning rate
    assert {key: value for key, value in values.items() if key not in
            {f"actor_rollout_ref.model.{name}" for name in ("lora_rank", "lora_alpha", "target_modules",
                                                            "lora_adapter_path", "lora.merge")}
            and key != "actor_rollout_ref.actor.optim.lr"} == {
        key: value for key, value in EXPECTED.items() if key != "actor_rollout_ref.actor.optim.lr"}
    # verl's own validation and config classes take it (peft's LoRA in verl's FSDP engine)
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    config = config_with(**{**CUSTOM, "policies": {**ONE_POLICY, "adapters": {"solver": {"rank": 4}}},
                            "model": {"path": str(tiny_model_path), "max_model_len": 24576}})
    verl_config = build_verl_config(config, PATHS)
    validate_config(verl_config, use_reference_policy=need_reference_policy(verl_config),
                    use_critic=need_critic(verl_config))
    model = omega_conf_to_dataclass(verl_config.actor_rollout_ref.model)
    assert (model.lora_rank, model.lora_alpha, model.target_modules, model.lora["merge"]) == (4, 16, "all-linear",
                                                                                             True)
    actor = omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor)
    assert actor.optim.lr == CUSTOM["trainer"]["learning_rate"]  # none of its own: the trainer's


@pytest.mark.parametrize(("policies", "words"), [
    ({"adapters": {"solver": {}, "critic": {}}, "agents": {"solver": "solver", "critic": "critic"}},
     "defines 2 policies (solver, critic), but verl trains one policy per run"),
    ({"adapters": {"solver": {"frozen": True}}, "default_policy": "solver"}, "is frozen and is the only policy"),
    ({"adapters": {"solver": {}}, "agents": {"solver": "solver"}}, "policies.default_policy is None, not 'solver'"),
    ({**ONE_POLICY, "reward": "per_agent"}, "policies.reward is 'per_agent'"),
])
def test_what_one_lora_cannot_do_is_refused(policies, words):
    config = config_with(**{**CUSTOM, "policies": policies})
    problems = config_problems(config)
    assert len(problems) == 1 and words in problems[0].render(), [problem.render() for problem in problems]
    with pytest.raises(UserError, match="polic"):
        VerlBackbone.check(config)
