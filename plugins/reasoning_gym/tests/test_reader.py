"""The `reasoning_gym` task reader with the real reasoning-gym package: two generators, a mix, seeds,
sized and endless splits, disjoint splits, and the one-paragraph errors of a bad config."""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest
from agenttune_reasoning_gym.generators import CHUNK
from agenttune_reasoning_gym.reader import ReasoningGymTaskReader

from agenttune.plugin_api import UserError

ONE_DIGIT_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
                  "allow_parentheses": False, "allow_negation": False}


def reader(**options: Any) -> ReasoningGymTaskReader:
    return ReasoningGymTaskReader(ReasoningGymTaskReader.Options(**options))


def test_basic_arithmetic_tasks_carry_the_question_the_answer_and_the_entry() -> None:
    tasks = list(reader(dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, splits={"train": 20}).read("train"))
    assert len(tasks) == 20 and len({task.task_id for task in tasks}) == 20
    for task in tasks:
        expression = task.query.removeprefix("Calculate ").removesuffix(".")
        assert str(eval(expression)) == task.metadata["ground_truth"]  # noqa: S307 - "3 + 4", written by the generator
        stored = task.metadata["reasoning_gym"]
        assert stored["dataset"] == "basic_arithmetic" and stored["config"] == ONE_DIGIT_SUMS
        assert stored["entry"]["question"] == task.query and stored["entry"]["answer"] == task.ground_truth


def test_spell_backward_tasks_are_words_spelled_backwards() -> None:
    tasks = list(reader(dataset="spell_backward", config={"min_word_len": 4}, splits={"train": 10}).read("train"))
    assert len(tasks) == 10
    for task in tasks:
        word = task.metadata["reasoning_gym"]["entry"]["metadata"]["word"]
        assert word in task.query and task.ground_truth == word[::-1]


def test_the_same_seed_gives_the_same_tasks_and_another_seed_others() -> None:
    def questions(seed: int) -> list[str]:
        return [task.query for task in reader(dataset="spell_backward", seed=seed, splits={"train": 30}).read("train")]

    assert questions(1) == questions(1)
    assert questions(1) != questions(2)


def test_splits_draw_from_different_streams() -> None:
    source = reader(dataset="spell_backward", splits={"train": 50, "test": 50})
    train = [task.query for task in source.read("train")]
    test = [task.query for task in source.read("test")]
    assert train[:10] != test[:10] and len(set(train) & set(test)) < 10


def test_the_training_split_never_repeats_a_held_out_question() -> None:
    # One-digit sums: 121 distinct questions, so streams of different seeds overlap a lot.
    source = reader(dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, splits={"train": None, "test": 40})
    held_out = {task.query for task in source.read("test")}
    assert len(held_out) > 20
    plain = reader(dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, splits={"other": None, "test": 40})
    assert held_out & {task.query for task in islice(plain.read("test"), 40)}  # sanity: same test questions
    train = [task.query for task in islice(source.read("train"), 600)]
    assert not held_out & set(train)
    assert len(set(train)) > 50  # the rest of the questions are there


def test_an_endless_split_goes_on_past_a_chunk_with_unique_ids() -> None:
    source = reader(dataset="spell_backward", splits={"train": None})
    assert source.endless("train")
    tasks = list(islice(source.read("train"), CHUNK + 50))
    assert len({task.task_id for task in tasks}) == CHUNK + 50
    assert tasks[CHUNK].query != tasks[0].query


def test_a_sized_split_is_not_endless_and_has_its_size() -> None:
    source = reader(dataset="basic_arithmetic", splits={"train": None, "test": 7})
    assert not source.endless("test")
    assert len(list(source.read("test"))) == 7


def test_a_weighted_mix_draws_from_both_generators_by_weight() -> None:
    source = reader(datasets={"basic_arithmetic": {"weight": 3, "config": ONE_DIGIT_SUMS},
                              "spell_backward": {"weight": 1}}, splits={"train": 400})
    tasks = list(source.read("train"))
    names = [task.metadata["reasoning_gym"]["dataset"] for task in tasks]
    assert 200 < names.count("basic_arithmetic") < 380 and names.count("spell_backward") > 20
    arithmetic = next(task for task in tasks if task.metadata["reasoning_gym"]["dataset"] == "basic_arithmetic")
    assert arithmetic.metadata["reasoning_gym"]["config"] == ONE_DIGIT_SUMS


# -- errors ----------------------------------------------------------------------------------------------------
def test_an_unknown_generator_is_one_paragraph_with_close_names() -> None:
    with pytest.raises(UserError) as caught:
        reader(dataset="basic_arithmatic").check(["train"])
    assert "no generator 'basic_arithmatic'" in caught.value.message and "basic_arithmetic" in caught.value.message
    assert "\n" not in caught.value.render()


def test_a_config_key_the_generator_lacks_is_named_with_the_keys_it_has() -> None:
    with pytest.raises(UserError) as caught:
        reader(dataset="basic_arithmetic", config={"max_digit": 2}).check(["train"])
    assert "'max_digit'" in caught.value.message and "max_digits" in (caught.value.hint or "")


def test_seed_or_size_in_a_config_point_to_the_readers_own_keys() -> None:
    with pytest.raises(UserError, match="task_reader.seed"):
        reader(dataset="basic_arithmetic", config={"seed": 3}).check(["train"])


def test_a_value_the_generator_refuses_is_reported_with_its_reason() -> None:
    with pytest.raises(UserError, match="max_terms must be >= min_terms"):
        reader(dataset="basic_arithmetic", config={"min_terms": 3, "max_terms": 2}).check(["train"])


def test_a_split_the_reader_does_not_have_is_named() -> None:
    with pytest.raises(UserError, match="no split 'validation'"):
        reader(dataset="basic_arithmetic").check(["train", "validation"])


def test_a_generator_with_every_question_held_out_stops_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import agenttune_reasoning_gym.reader as reader_module

    monkeypatch.setattr(reader_module, "MAX_SKIPPED_IN_A_ROW", 300)
    # 3000 held-out draws cover all 121 one-digit sums: nothing is left to train on.
    source = reader(dataset="basic_arithmetic", config=ONE_DIGIT_SUMS, splits={"train": 10_000, "test": 3000})
    with pytest.raises(UserError, match="too few distinct questions"):
        list(source.read("train"))


def test_bad_options_are_one_paragraph_through_the_cli(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from agenttune.plugin_api import cli_main

    conf = tmp_path / "bad.yaml"
    conf.write_text("task_reader: {type: reasoning_gym, dataset: basic_arithmetic, datasets: {chain_sum: {}}}\n")
    with pytest.raises(SystemExit) as exit_:
        cli_main(["data", "preview", "--conf", str(conf)])
    assert exit_.value.code == 2
    output = capsys.readouterr()
    assert "exactly one of `dataset`" in output.out + output.err
    assert "Traceback" not in output.out + output.err


def test_a_module_of_ones_own_generators_is_imported_first_and_a_missing_one_named() -> None:
    source = reader(imports=["sleepy_generator"], dataset="sleepy", splits={"train": 3})
    source.check(["train"])
    assert [task.metadata["reasoning_gym"]["imports"] for task in source.read("train")] == [["sleepy_generator"]] * 3
    with pytest.raises(UserError, match="module 'no_such_generators' could not be imported"):
        reader(imports=["no_such_generators"], dataset="basic_arithmetic").check(["train"])
