"""The agenttune → Trinity-RFT config translation, judged by Trinity's own loader and validators."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml
from agenttune_trinity.launch import check_and_update, load_trinity_config, write_trinity_config
from agenttune_trinity.translation import (
    MONITOR_TYPE,
    TRANSLATIONS,
    WORKFLOW_TYPE,
    TrinityPaths,
    markdown_table,
    trinity_config,
)

from agenttune.plugin_api import UserError

README = Path(__file__).parents[1] / "README.md"


def loaded(config, tmp_path: Path):
    """The generated config, written and loaded back through Trinity's `load_config`."""
    paths = TrinityPaths.for_run(tmp_path / "run", config.model.path)
    return load_trinity_config(write_trinity_config(trinity_config(config, paths), tmp_path / "run"))


def _schema_type(annotation: typing.Any) -> typing.Any:
    """The dataclass (or dict) an annotation of Trinity's config means, Optional/List unwrapped."""
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(__import__("trinity.common.config", fromlist=["*"])))  # noqa: S307
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        return _schema_type(next(arg for arg in typing.get_args(annotation) if arg is not type(None)))
    if origin in (list, typing.List):  # noqa: UP006
        return _schema_type(typing.get_args(annotation)[0])
    if origin in (dict, typing.Dict) or annotation in (dict, typing.Dict):  # noqa: UP006
        return dict
    return annotation


def test_every_translated_key_exists_in_trinitys_config_schema():
    from trinity.common.config import Config

    for row in TRANSLATIONS:
        node: typing.Any = Config
        for part in row.trinity_key.split("."):
            if node is dict:  # a free-form mapping (e.g. policy_loss_fn_args): any key goes
                break
            fields = {field.name: field for field in dataclasses.fields(node)}
            assert part in fields, f"{row.trinity_key}: Trinity's {node.__name__} has no field {part!r}"
            node = _schema_type(fields[part].type)


def test_generated_config_passes_trinitys_loader_and_validation(make_config, tmp_path: Path):
    config = make_config(trainer={"n_gpus_per_node": 4, "nnodes": 2, "learning_rate": 3e-6, "save_freq": 5,
                                  "lr_schedule": "cosine", "warmup_steps": 3, "total_steps": 7},
                         algorithm={"kl_coef": 0.02, "kl_estimator": "k3", "clip_ratio_high": 0.28})
    cfg = loaded(config, tmp_path)
    check_and_update(cfg)  # Trinity's validators, with the cluster shape from the config (no Ray)

    assert (cfg.mode, cfg.project, cfg.name) == ("both", "trinity-test", "calc")
    assert cfg.ray_namespace == "trinity-test/calc/run"  # one namespace per run directory
    assert cfg.checkpoint_job_dir == str((tmp_path / "run" / "checkpoints" / "trinity-test" / "calc").resolve())
    assert cfg.model.model_path == config.model.path
    assert (cfg.model.max_model_len, cfg.model.max_response_tokens) == (1024, 96)
    assert (cfg.cluster.node_num, cfg.cluster.gpu_per_node) == (2, 4)
    # half of the 8 GPUs roll out (4 vLLM engines), the other half train
    assert (cfg.cluster.rollout_gpu_num, cfg.cluster.trainer_gpu_num) == (4, 4)
    rollout_model = cfg.explorer.rollout_model
    assert (rollout_model.engine_type, rollout_model.engine_num, rollout_model.tensor_parallel_size) == ("vllm", 4, 1)
    assert rollout_model.enable_openai_api and not rollout_model.enable_history
    assert cfg.explorer.runner_per_model == 2  # max_env_worker 4 // num_repeat 2
    assert cfg.explorer.max_timeout == 300 + 60 + 60

    algorithm = cfg.algorithm
    assert (algorithm.algorithm_type, algorithm.repeat_times) == ("multi_step_grpo", 2)
    assert algorithm.advantage_fn == "step_wise_grpo"  # filled in by Trinity for multi_step_grpo
    assert algorithm.policy_loss_fn_args["clip_range_low"] == 0.2
    assert algorithm.policy_loss_fn_args["clip_range_high"] == 0.28
    assert (algorithm.kl_loss_fn, algorithm.kl_loss_fn_args["kl_coef"]) == ("k3", 0.02)
    assert (algorithm.kl_penalty_fn, algorithm.entropy_loss_fn) == ("none", "none")
    optimizer = algorithm.optimizer
    assert (optimizer.lr, optimizer.lr_scheduler_type, optimizer.lr_warmup_steps) == (3e-6, "cosine", 3)

    assert (cfg.buffer.batch_size, cfg.buffer.train_batch_size, cfg.buffer.total_steps) == (2, 4, 7)
    [taskset] = cfg.buffer.explorer_input.tasksets
    assert (taskset.path, taskset.split) == (str((tmp_path / "run" / "trinity" / "tasks").resolve()), "train")
    assert taskset.default_workflow_type == WORKFLOW_TYPE
    assert taskset.workflow_args["agenttune_run_dir"] == str((tmp_path / "run").resolve())
    assert taskset.workflow_args["agenttune_source_dir"] == str(Path(__file__).parent)  # workflow modules
    assert taskset.repeat_times == 2
    assert (taskset.rollout_args.temperature, taskset.rollout_args.max_tokens) == (0.9, 96)
    assert taskset.data_selector.selector_type == "shuffle"
    assert cfg.buffer.explorer_input.eval_tasksets == []

    assert (cfg.trainer.trainer_type, cfg.trainer.save_interval, cfg.trainer.total_steps) == ("verl", 5, 7)
    assert cfg.synchronizer.sync_method.value == "nccl" and cfg.synchronizer.sync_interval == 1
    assert cfg.monitor.monitor_type == MONITOR_TYPE
    assert cfg.monitor.monitor_args == {"metrics_file": f"{(tmp_path / 'run').resolve()}/metrics.jsonl",
                                        "inner": ["tensorboard"]}


def test_trinity_resolves_the_workflow_and_monitor_by_their_dotted_paths():
    from agenttune_trinity.monitor import AgentTuneMonitor
    from agenttune_trinity.workflow import AgentTuneWorkflow
    from trinity.common.workflows import WORKFLOWS
    from trinity.utils.monitor import MONITOR

    assert WORKFLOWS.get(WORKFLOW_TYPE) is AgentTuneWorkflow
    assert WORKFLOWS.get("agenttune_workflow") is AgentTuneWorkflow
    assert MONITOR.get(MONITOR_TYPE) is AgentTuneMonitor


def test_one_gpu_runs_colocated(make_config, tmp_path: Path):
    cfg = loaded(make_config(trainer={"n_gpus_per_node": 1}), tmp_path)
    check_and_update(cfg)
    assert cfg.mode == "colocate"
    assert cfg.explorer.rollout_model.engine_num == 1
    assert cfg.synchronizer.sync_method.value == "memory"  # Trinity's choice for colocate


def test_validation_split_becomes_an_eval_taskset(make_config, tmp_path: Path):
    config = make_config(task_reader={"type": "file", "path": "data", "validation_split": "validation"},
                         trainer={"n_gpus_per_node": 2, "test_freq": 3, "val_before_train": True},
                         rollout={"num_repeat": 4, "val_temperature": 0.0})
    cfg = loaded(config, tmp_path)
    check_and_update(cfg)
    [evaluation] = cfg.buffer.explorer_input.eval_tasksets
    assert (evaluation.split, evaluation.repeat_times, evaluation.rollout_args.temperature) == ("validation", 1, 0.0)
    assert evaluation.default_workflow_type == WORKFLOW_TYPE
    assert (cfg.explorer.eval_interval, cfg.explorer.eval_on_startup) == (3, True)


def test_trinity_section_overrides_the_table_key_by_key(make_config, tmp_path: Path):
    config = make_config(trainer={"n_gpus_per_node": 8}, trinity={
        "algorithm": {"algorithm_type": "grpo"},
        "explorer": {"rollout_model": {"engine_num": 2, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.7}},
        "buffer": {"explorer_input": {"taskset": {"format": {"system_prompt": "be brief"}}}},
    })
    cfg = loaded(config, tmp_path)
    check_and_update(cfg)
    assert cfg.algorithm.algorithm_type == "grpo" and cfg.algorithm.advantage_fn == "grpo"
    rollout_model = cfg.explorer.rollout_model
    assert (rollout_model.engine_num, rollout_model.tensor_parallel_size) == (2, 2)
    assert rollout_model.gpu_memory_utilization == 0.7 and cfg.cluster.trainer_gpu_num == 4
    assert rollout_model.enable_openai_api  # untouched keys of the same section stay
    [taskset] = cfg.buffer.explorer_input.tasksets
    assert taskset.format.system_prompt == "be brief" and taskset.default_workflow_type == WORKFLOW_TYPE


def test_unknown_trinity_key_is_a_clear_error(make_config, tmp_path: Path):
    config = make_config(trinity={"explorer": {"rollout_modle": {"engine_num": 2}}})
    with pytest.raises(UserError, match="rollout_modle") as caught:
        loaded(config, tmp_path)
    assert "trinity:" in caught.value.render()


def test_trinity_validation_errors_are_user_errors(make_config, tmp_path: Path):
    # 4 GPUs, but the passthrough asks for 4 rollout engines: nothing left to train on
    cfg = loaded(make_config(trinity={"explorer": {"rollout_model": {"engine_num": 4}}}), tmp_path)
    with pytest.raises(UserError, match="Not enough GPUs for trainer"):
        check_and_update(cfg)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"trainer": {"lr_schedule": "linear"}}, "trainer.lr_schedule = 'linear'"),
    ({"algorithm": {"norm_adv_by_std": False}}, "algorithm.norm_adv_by_std = false"),
    ({"algorithm": {"adv_estimator": "rloo"}}, "algorithm.adv_estimator = 'rloo' is not available"),
    ({"algorithm": {"policy_loss": "my_loss"}}, "algorithm.policy_loss = 'my_loss' has no equivalent"),
    ({"algorithm": {"dynamic_sampling": {"enable": True}}}, "algorithm.dynamic_sampling.enable is not translated"),
    ({"algorithm": {"estimator_options": {"norm_by_std": False}}}, "algorithm.estimator_options.norm_by_std = false"),
    ({"algorithm": {"rollout_correction": {"rollout_is": "token"}}},
     "algorithm.rollout_correction.rollout_is='token'"),
    ({"algorithm": {"rollout_correction": {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.5_2.0"}}},
     "algorithm.rollout_correction.rollout_rs='seq_mean_k1'"),
    ({"algorithm": {"rollout_correction": {"bypass_mode": True, "loss_type": "reinforce", "rollout_is": "token"}}},
     "algorithm.rollout_correction.rollout_is='token'"),
])
def test_what_trinity_cannot_do_is_refused(make_config, overrides, message):
    from agenttune_trinity.backbone import TrinityBackbone

    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        TrinityBackbone.check(make_config(**overrides))


def test_trinitys_own_rollout_correction_is_refused_not_dropped(make_config):
    """Trinity-RFT 0.6.0 hands `algorithm.rollout_correction` to verl's bypass_mode loss, which its own policy
    losses replace: set through the passthrough it would do nothing."""
    from agenttune_trinity.backbone import TrinityBackbone

    with pytest.raises(UserError, match=r"trinity\.algorithm\.rollout_correction is not applied"):
        TrinityBackbone.check(make_config(trinity={"algorithm": {"rollout_correction": {"rollout_is": "token"}}}))


def test_validation_without_a_split_is_refused(make_config):
    from agenttune_trinity.backbone import TrinityBackbone

    with pytest.raises(UserError, match="validation_split is not set"):
        TrinityBackbone.check(make_config(trainer={"test_freq": 2}))


def test_config_show_prints_a_config_trinity_loads(make_config, tmp_path: Path, data_dir: Path, tiny_model_path):
    from typer.testing import CliRunner

    from agenttune.plugin_api import cli_app as app

    conf = tmp_path / "agent.yaml"
    conf.write_text(yaml.safe_dump({
        "workflow": "agenttune.testing.agents:CalculatorWorkflow",
        "task_reader": {"type": "file", "path": str(data_dir)},
        "model": {"path": str(tiny_model_path)},
        "trainer": {"n_gpus_per_node": 8},
        "rollout": {"num_repeat": 8},
        "trinity": {"explorer": {"rollout_model": {"gpu_memory_utilization": 0.8}}},
    }))
    result = CliRunner().invoke(app, ["config", "show", "--conf", str(conf), "--backbone", "trinity"])
    assert result.exit_code == 0, result.output
    _, marker, generated = result.output.partition("# --- generated trinity config ---\n")
    assert marker, result.output
    shown = tmp_path / "shown.yaml"
    shown.write_text(generated)
    cfg = load_trinity_config(shown)
    assert cfg.algorithm.repeat_times == 8
    assert cfg.explorer.rollout_model.engine_num == 4
    assert cfg.explorer.rollout_model.gpu_memory_utilization == 0.8
    assert cfg.buffer.explorer_input.taskset.path == "<run_dir>/trinity/tasks"


def test_the_readme_passthrough_example_is_accepted(make_config, tmp_path: Path):
    text = README.read_text(encoding="utf-8")
    example = text.split("### Passing Trinity keys through", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = loaded(make_config(trainer={"n_gpus_per_node": 8}, **yaml.safe_load(example)), tmp_path)
    check_and_update(cfg)
    assert (cfg.explorer.rollout_model.engine_num, cfg.explorer.rollout_model.tensor_parallel_size) == (2, 2)
    assert cfg.trainer.trainer_strategy == "fsdp" and cfg.synchronizer.sync_interval == 2


def test_readme_shows_the_translation_table():
    assert markdown_table() in README.read_text(encoding="utf-8"), (
        "README.md's translation table is out of date: paste agenttune_trinity.translation.markdown_table()")


# Trinity-RFT 0.6.0 has no importance-sampling correction, so the asynchronous modes' default (TIS) is refused
# (test_every_key_translated.py); these runs use Trinity's own rule, PPO's ratio to the engine's log-probs.
BYPASS = {"rollout_correction": {"bypass_mode": True}}


@pytest.mark.parametrize(("trainer", "style", "offset", "strategy", "staleness", "inflight"), [
    ({}, "fixed", 0, "default", None, 2),  # sync: Trinity's on-policy schedule and default sampler
    ({"mode": "one_step_off"}, "fixed", 1, "default", None, 2),  # the explorer runs one step ahead
    ({"mode": "async", "max_staleness": 2}, "fully_async", 0, "staleness_control", 2, 3),
    ({"mode": "async", "max_staleness": 0}, "fully_async", 0, "staleness_control", 0, 1),
])
def test_trainer_mode_becomes_trinitys_schedule(make_config, tmp_path: Path, trainer, style, offset, strategy,
                                                staleness, inflight):
    """trainer.mode / max_staleness through Trinity's loader and validators: the synchronizer's style and
    offset, the explorer's in-flight window, and the sampler that enforces the staleness bound."""
    cfg = loaded(make_config(trainer={"n_gpus_per_node": 4, **trainer}, algorithm=BYPASS), tmp_path)
    check_and_update(cfg)
    assert (cfg.synchronizer.sync_style.value, cfg.synchronizer.sync_offset) == (style, offset)
    assert cfg.synchronizer.sync_interval == 1
    assert cfg.algorithm.sample_strategy == strategy  # multi_step_grpo's default when not asynchronous
    assert (cfg.algorithm.sample_strategy_args or {}).get("max_staleness") == staleness
    assert cfg.explorer.max_inflight_batches == inflight  # 2 is Trinity's default


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
async def test_trinitys_staleness_sampler_keeps_what_agenttune_allows(make_config, tmp_path: Path, monkeypatch,
                                                                      max_staleness):
    """Trinity's own sample strategy, built from the translated config as its trainer builds it
    (`SAMPLE_STRATEGY.get(...)(buffer, **sample_strategy_args)`), reads for step s (which trains
    weights of version s - 1) only experiences of version >= s - 1 - trainer.max_staleness."""
    from trinity.algorithm import SAMPLE_STRATEGY
    from trinity.algorithm.sample_strategy import sample_strategy as module
    from trinity.common.experience import Experience

    cfg = loaded(make_config(trainer={"n_gpus_per_node": 4, "mode": "async", "max_staleness": max_staleness},
                             algorithm=BYPASS), tmp_path)
    check_and_update(cfg)
    asked = []

    class ExperienceQueue:  # stands in for the Ray-actor queue that Trinity's explorer fills
        async def read(self, min_model_version=0):
            asked.append(min_model_version)
            return [Experience(tokens=[1, 2], prompt_length=1, info={"model_version": min_model_version})]

    monkeypatch.setattr(module, "get_buffer_reader", lambda buffer_config: ExperienceQueue())
    strategy = SAMPLE_STRATEGY.get(cfg.algorithm.sample_strategy)(cfg.buffer, **cfg.algorithm.sample_strategy_args)
    for step in (1, 5, 10):
        await strategy.sample(step)
    trained_versions = [step - 1 for step in (1, 5, 10)]
    assert asked == [max(0, version - max_staleness) for version in trained_versions]


def test_async_with_validation_is_refused_and_the_suggested_mode_validates(make_config, data_dir, tmp_path: Path):
    """Trinity 0.6's fully_async style rejects evaluation tasksets; agenttune says so before any run,
    and the mode it suggests instead (one_step_off) passes Trinity's validators with validation on."""
    from agenttune_trinity.backbone import TrinityBackbone

    validating = {"task_reader": {"type": "file", "path": str(data_dir), "validation_split": "validation"}}
    with pytest.raises(UserError) as raised:
        TrinityBackbone.check(make_config(trainer={"mode": "async", "test_freq": 2}, algorithm=BYPASS, **validating))
    message = raised.value.render()
    assert "trainer.mode = 'async' cannot validate" in message and "trainer.mode=one_step_off" in message

    cfg = loaded(make_config(trainer={"n_gpus_per_node": 4, "mode": "one_step_off", "test_freq": 2},
                             algorithm=BYPASS, **validating), tmp_path)
    check_and_update(cfg)
    assert len(cfg.buffer.explorer_input.eval_tasksets) == 1 and cfg.synchronizer.sync_offset == 1


@pytest.mark.parametrize(("loss", "trinity_loss", "aggregation"), [("ppo_clip", "ppo", "token-mean"),
                                                                    ("gspo", "gspo", "seq-mean-token-mean"),
                                                                    ("cispo", "cispo", "token-mean")])
def test_each_policy_loss_becomes_trinitys_own(make_config, tmp_path: Path, loss, trinity_loss, aggregation):
    cfg = loaded(make_config(algorithm={"policy_loss": loss, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28}), tmp_path)
    assert cfg.algorithm.policy_loss_fn == trinity_loss and cfg.algorithm.loss_agg_mode == aggregation
    assert cfg.algorithm.policy_loss_fn_args["clip_range_low"] == 0.2
    assert cfg.algorithm.policy_loss_fn_args["clip_range_high"] == 0.28
