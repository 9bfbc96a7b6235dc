"""Configuration: sources and their priority, error messages, `config show/schema/docs`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from agenttune.config.models import AgentTuneConfig
from agenttune.entrypoints.cli.config_docs import generate
from agenttune.errors import UserError
from agenttune.registry.config_loading import config_model, load_config

REPO = Path(__file__).resolve().parents[2]


# -- priority: defaults < YAML < AGENTTUNE_* environment < key=value < flags --------------------------

def test_every_source_in_priority_order(write_yaml, monkeypatch):
    conf = write_yaml({"rollout": {"num_repeat": 2, "temperature": 0.5, "top_p": 0.9},
                       "model": {"path": "from-yaml"}, "backbone": "from-yaml"})
    monkeypatch.setenv("AGENTTUNE_ROLLOUT__TEMPERATURE", "0.7")
    monkeypatch.setenv("AGENTTUNE_ROLLOUT__TOP_P", "0.8")
    monkeypatch.setenv("AGENTTUNE_BACKBONE", "from-env")
    config = load_config(conf, ["rollout.top_p=0.6", "backbone=from-override"], backbone="from-flag")
    assert config.rollout.max_env_worker == AgentTuneConfig().rollout.max_env_worker  # default
    assert config.rollout.num_repeat == 2  # YAML over default
    assert config.model.path == "from-yaml"
    assert config.rollout.temperature == 0.7  # environment over YAML
    assert config.rollout.top_p == 0.6  # override over environment
    assert config.backbone == "from-flag"  # --backbone over everything


def test_environment_variable_sets_a_key_the_yaml_does_not_mention(write_yaml, monkeypatch):
    monkeypatch.setenv("AGENTTUNE_DEBUG__FIRST_N_TASKS", "9")
    config = load_config(write_yaml({"debug": {"max_parallel": 1}}))
    assert (config.section("debug").first_n_tasks, config.section("debug").max_parallel) == (9, 1)


def test_overrides_parse_values_as_yaml_and_create_nested_keys():
    config = load_config(None, ["rollout.compute_madness_checklist=[nonsense]", "judge.type=custom",
                                "judge.judge_protocol=pkg.mod:Judge", "local.warmup.steps=2",
                                "task_reader.validation_split=null"])
    assert config.rollout.compute_madness_checklist == ["nonsense"]
    assert config.judge.judge_protocol == "pkg.mod:Judge"
    assert config.section("local").warmup.steps == 2
    assert config.task_reader.validation_split is None


def test_astune_wrapped_file_and_arrow_references_load(write_yaml):
    conf = write_yaml({"astune": {"project_name": "math_agent",
                                  "task_reader": {"type": "huggingface_dat_repo",
                                                  "huggingface_dat_repo": {"dataset_path": "gsm8k/main"}},
                                  "judge": {"judge_protocol": "pkg.judges->MathJudge"}}})
    config = load_config(conf)
    assert config.project_name == "math_agent"
    assert config.task_reader.type == "huggingface"
    assert config.task_reader.options() == {"dataset_path": "gsm8k/main"}


def test_agenttune_variables_that_are_not_config_keys_are_refused_with_a_guess(monkeypatch):
    monkeypatch.setenv("AGENTTUNE_LOAD_PLUGINS", "builtins")  # read elsewhere: allowed
    assert load_config(None).backbone == AgentTuneConfig().backbone
    monkeypatch.setenv("AGENTTUNE_ROLLOUT_NUM_REPEAT", "4")  # one underscore: pydantic-settings would skip it
    with pytest.raises(UserError, match="AGENTTUNE_ROLLOUT_NUM_REPEAT is not a configuration key.*did you mean "
                                        "AGENTTUNE_ROLLOUT__NUM_REPEAT"):
        load_config(None)
    monkeypatch.delenv("AGENTTUNE_ROLLOUT_NUM_REPEAT")
    monkeypatch.setenv("AGENTTUNE_ROLOUT__NUM_REPEAT", "4")  # a misspelt section
    with pytest.raises(UserError, match="did you mean AGENTTUNE_ROLLOUT__NUM_REPEAT"):
        load_config(None)
    monkeypatch.delenv("AGENTTUNE_ROLOUT__NUM_REPEAT")
    monkeypatch.setenv("AGENTTUNE_SOMETHING_ELSE", "1")
    with pytest.raises(UserError, match="AGENTTUNE_SOMETHING_ELSE is not a configuration key"):
        load_config(None)


# -- mistakes --------------------------------------------------------------------------------------------

def test_unknown_keys_suggest_the_closest_one(write_yaml):
    with pytest.raises(UserError) as raised:
        load_config(write_yaml({"rollout": {"num_repet": 3}, "modle": {"path": "x"}}))
    message = str(raised.value)
    assert "unknown key 'rollout.num_repet'; did you mean 'rollout.num_repeat'?" in message
    assert "unknown key 'modle'; did you mean 'model'?" in message
    assert "?." not in message


def test_unknown_key_without_a_close_match_lists_the_valid_ones(write_yaml):
    with pytest.raises(UserError, match=r"unknown key 'debug.zzz' \(valid keys here: first_n_tasks, max_parallel\)"):
        load_config(write_yaml({"debug": {"zzz": 1}}))


def test_wrong_types_name_the_key_the_value_and_where_it_came_from(write_yaml, monkeypatch):
    conf = write_yaml({"rollout": {"temperature": "hot"}})
    monkeypatch.setenv("AGENTTUNE_ROLLOUT__NUM_REPEAT", "many")
    with pytest.raises(UserError) as raised:
        load_config(conf, ["model.max_model_len=-5"])
    message = str(raised.value)
    assert f"Invalid configuration in {conf}" in message
    assert "rollout.temperature = 'hot' is invalid: Input should be a valid number" in message
    assert "rollout.num_repeat = 'many' is invalid" in message
    assert "(from the environment variable AGENTTUNE_ROLLOUT__NUM_REPEAT)" in message
    assert "model.max_model_len = -5 is invalid: Input should be greater than 0 (from the command line)" in message


@pytest.mark.parametrize(("text", "expected"), [
    ("rollout:\n  num_repeat: [3\n", r"is not valid YAML at line 3, column 1"),
    ("- just\n- a list\n", "must hold a mapping of keys, not a list"),
])
def test_yaml_problems(tmp_path, text, expected):
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=expected):
        load_config(path)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(UserError, match="does not exist. Check the path given to --conf."):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="is a directory"):
        load_config(tmp_path)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UserError, match="is not UTF-8 text"):
        load_config(binary)


def test_bad_override_syntax():
    with pytest.raises(UserError, match="'rollout.num_repeat' is not of the form key.path=value"):
        load_config(None, ["rollout.num_repeat"])


# -- plugin config sections --------------------------------------------------------------------------------

class GreetingSection(BaseModel):
    """What the greeter says."""

    model_config = ConfigDict(extra="forbid")
    greeting: str = Field(default="hello", description="What to say.")


def test_plugin_sections_are_validated_and_reachable(register_plugin, write_yaml):
    register_plugin(config_sections={"greeter": GreetingSection})
    config = load_config(write_yaml({"greeter": {"greeting": "hi"}}))
    assert config.section("greeter").greeting == "hi"
    with pytest.raises(UserError, match="unknown key 'greeter.greetin'; did you mean 'greeter.greeting'"):
        load_config(write_yaml({"greeter": {"greetin": "hi"}}))


def test_plugin_sections_disappear_with_the_plugin(write_yaml):
    with pytest.raises(UserError, match="unknown key 'greeter'") as raised:
        load_config(write_yaml({"greeter": {"greeting": "hi"}}))
    assert "install that plugin" in str(raised.value) and "agenttune plugins list" in str(raised.value)


def test_a_backbone_owns_the_section_named_after_it(register_plugin, write_yaml):
    from agenttune.components.backbone import Backbone

    class Greeting(Backbone):
        name = "greeting"
        Options = GreetingSection

    assert "greeting" not in config_model().model_fields
    register_plugin(backbones=[Greeting])
    config = load_config(write_yaml({"greeting": {"greeting": "hi"}}))
    assert config.section("greeting", GreetingSection).greeting == "hi"
    assert config_model().model_fields["greeting"].description == "What the greeter says."  # its docstring
    with pytest.raises(UserError, match="unknown key 'greeting.greetin'; did you mean 'greeting.greeting'"):
        load_config(write_yaml({"greeting": {"greetin": "hi"}}))


def test_the_built_in_backbones_sections_keep_their_keys(write_yaml):
    from agenttune.backbones.debug import DebugOptions
    from agenttune.backbones.local.options import LocalOptions

    config = load_config(write_yaml({"local": {"device": "cpu", "warmup": {"steps": 3}}, "debug": {"max_parallel": 1}}))
    assert config.section("local", LocalOptions).warmup.steps == 3
    assert config.section("debug", DebugOptions).max_parallel == 1
    with pytest.raises(UserError, match="'local.lora_rnak'; did you mean 'local.lora_rank'"):
        load_config(write_yaml({"local": {"lora_rnak": 4}}))


def test_one_section_model_may_come_from_two_plugins_but_two_models_may_not(register_plugin):
    from agenttune.errors import PluginError

    class OtherSection(BaseModel):
        greeting: int = 0

    register_plugin(config_sections={"greeter": GreetingSection}, name="one")
    register_plugin(config_sections={"greeter": GreetingSection}, name="two")
    assert config_model().model_fields["greeter"].annotation is GreetingSection
    register_plugin(config_sections={"greeter": OtherSection}, name="three", distribution="agenttune-plugin-three")
    with pytest.raises(PluginError, match="both define the config section 'greeter', with different models"):
        config_model()


def test_a_directly_made_config_reads_owned_sections_as_their_defaults():
    from agenttune.backbones.local.options import LocalOptions

    config = AgentTuneConfig()
    assert config.section("local", LocalOptions) == LocalOptions()
    with pytest.raises(UserError, match="no section 'greeter'"):
        config.section("greeter")


def test_the_sources_compose_into_the_model_with_the_plugins_sections(write_yaml, monkeypatch):
    monkeypatch.setenv("AGENTTUNE_ROLLOUT__NUM_REPEAT", "3")
    config = load_config(write_yaml({"rollout": {"num_repeat": 2, "top_k": 5}}), ["rollout.top_p=0.5"])
    assert type(config) is config_model()
    assert (config.rollout.num_repeat, config.rollout.top_k, config.rollout.top_p) == (3, 5, 0.5)


# -- config show / schema / docs -----------------------------------------------------------------------------

def test_config_show_prints_the_resolved_yaml(run_cli, monkeypatch):
    monkeypatch.chdir(REPO / "tests" / "config" / "bad_configs")  # a complete config: show resolves every reference
    conf = "valid.yaml"
    result = run_cli("config", "show", f"--conf={conf}", "trainer.seed=7", "rollout.num_repeat=3")
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    assert shown["rollout"]["num_repeat"] == 3
    assert shown["trainer"]["seed"] == 7
    assert shown["model"]["max_model_len"] == 1024 and shown["rollout"]["top_p"] == AgentTuneConfig().rollout.top_p
    resolved = load_config(conf, ["trainer.seed=7", "rollout.num_repeat=3"])
    assert type(resolved).model_validate(shown).model_dump() == resolved.model_dump()  # complete and valid


def test_config_show_with_a_backbone_prints_its_generated_config(run_cli, register_plugin):
    from agenttune.components.backbone import Backbone

    class Translating(Backbone):
        name = "translating"

        @classmethod
        def native_config(cls, config):
            return {"actor_rollout_ref": {"rollout": {"n": config.rollout.num_repeat}}}

    register_plugin(backbones=[Translating])
    result = run_cli("config", "show", "--backbone", "translating", "rollout.num_repeat=6")
    assert result.exit_code == 0, result.output
    ours, native = result.stdout.split("# --- generated translating config ---\n")
    assert yaml.safe_load(ours)["backbone"] == "translating"
    assert yaml.safe_load(native) == {"actor_rollout_ref": {"rollout": {"n": 6}}}


def test_config_schema_is_the_models_json_schema(run_cli):
    result = run_cli("config", "schema")
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    assert schema["properties"]["rollout"]["$ref"].endswith("RolloutConfig")
    assert schema["$defs"]["RolloutConfig"]["properties"]["num_repeat"]["default"] == 4
    assert schema["$defs"]["RolloutConfig"]["additionalProperties"] is False


def test_committed_config_docs_are_up_to_date():
    committed = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert committed == generate(), "docs/config.md is stale: run `agenttune config docs -o docs/config.md`"


def test_config_docs_cover_every_field_with_its_default():
    text = generate()
    for section_name, field in AgentTuneConfig.model_fields.items():
        assert f"| `{section_name}` |" in text
        model = field.annotation
        for name, sub in getattr(model, "model_fields", {}).items():
            assert f"| `{section_name}.{name}` |" in text
            assert sub.description, f"{section_name}.{name} has no description"
    assert "| `task_reader.path` | str \\| mapping of str | required |" in text
    assert "| `task_reader.dataset_path` | str | required |" in text


def test_escaped_surrogate_pairs_in_yaml_are_joined_and_lone_ones_refused(tmp_path):
    """JSON writers escape emoji as UTF-16 pairs ("\\ud83d\\udd0d"); YAML reads each half alone (issue 24)."""
    path = tmp_path / "c.yaml"
    path.write_text('project_name: "find \\ud83d\\udd0d"\ntask_reader:\n  validation_split: "[\\ud83d\\udd0d]"\n',
                    encoding="utf-8")
    config = load_config(path, ["experiment_name=\"x\\ud83d\\ude00\""])
    assert config.project_name == "find \U0001F50D" and config.task_reader.validation_split == "[\U0001F50D]"
    assert config.experiment_name == "x\U0001F600"
    config.project_name.encode("utf-8")  # whole characters: any encoder takes them
    path.write_text('project_name: "half \\ud83d here"\n', encoding="utf-8")
    with pytest.raises(UserError, match="project_name holds a lone UTF-16 surrogate"):
        load_config(path)


def test_a_loaded_config_pickles_with_its_sections(register_plugin, write_yaml):
    """Workflow processes receive the config pickled; its class is made at run time from the sections."""
    import copy
    import pickle

    register_plugin(config_sections={"greeter": GreetingSection})
    config = load_config(write_yaml({"greeter": {"greeting": "hi"}, "local": {"device": "cpu"}}))
    for copied in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):
        assert type(copied) is type(config)
        assert copied == config and copied.source_dir == config.source_dir
        assert copied.section("greeter", GreetingSection).greeting == "hi"


# -- asynchronous modes correct stale tokens unless told otherwise -------------------------------------

@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_asynchronous_modes_default_to_token_level_truncated_importance_sampling(mode):
    correction = load_config({}, [f"trainer.mode={mode}"]).algorithm.rollout_correction
    assert (correction.rollout_is, correction.rollout_is_threshold) == ("token", 2.0)


def test_synchronous_training_keeps_rollout_correction_off():
    assert not load_config({}, ["trainer.mode=sync"]).algorithm.rollout_correction.enabled


def test_an_explicit_rollout_correction_is_kept_in_asynchronous_modes():
    off = load_config({}, ["trainer.mode=async", "algorithm.rollout_correction.rollout_is=null"])
    assert not off.algorithm.rollout_correction.enabled
    chosen = load_config({}, ["trainer.mode=async", "algorithm.rollout_correction.rollout_is=sequence",
                              "algorithm.rollout_correction.rollout_is_threshold=5.0"])
    assert (chosen.algorithm.rollout_correction.rollout_is,
            chosen.algorithm.rollout_correction.rollout_is_threshold) == ("sequence", 5.0)
