"""The byte-offset index of a rollout file: its shortcut summaries equal a full parse, always."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logview_runs import step_episodes

from agenttune.logview.step_index import Query, StepIndex, index_line, summarise
from agenttune.rollout.log import RolloutLog
from agenttune.testing import tiny_tokenizer
from agenttune.workflow.episode import Episode, Sample
from agenttune.workflow.task import Task

# Keys and text that look like the markers the shortcut looks for, in places it must not be fooled.
TRICKY = st.sampled_from(['"samples":[', ',"samples":[', ',"metrics":{', '"split":"x"', "}", "]", "{", "\\", '"', "\n", "é"])
TEXT = st.lists(st.one_of(TRICKY, st.text(max_size=5)), max_size=4).map("".join)
KEYS = st.one_of(st.sampled_from(["samples", "metrics", "split", "messages", "episode_id"]), TRICKY, TEXT)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


def index_of(path) -> StepIndex:
    index = StepIndex(path)
    index.refresh()
    return index


def full_summaries(path) -> list[dict]:
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    return [summarise(json.loads(line), number) for number, line in enumerate(lines)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metadata=st.dictionaries(KEYS, JSON_VALUES, max_size=3),
       output=st.dictionaries(KEYS, JSON_VALUES, max_size=3),
       text=TEXT)
def test_shortcut_summaries_equal_full_parse(tmp_path_factory, metadata, output, text):
    path = tmp_path_factory.mktemp("index") / "step_000001_train.jsonl"
    episode = Episode(
        episode_id=f"e-{text}", task=Task(task_id=text, query=text, metadata=metadata), group_id="g",
        error=text or None, reward=0.5, samples=[Sample(prompt_ids=[1, 2], response_ids=[3], loss_mask=[1],
                                                         logprobs=[-0.1])],
        messages=[{"role": "user", "content": text, "extra": metadata}], output=output,
        judge_details={"metrics": output}, metrics={"calls": 3.0},
    )
    RolloutLog(path.parent).write(1, "train", [episode, episode], tokenizer=None)
    assert [entry.summary for entry in index_of(path).entries] == full_summaries(path)


def test_shortcut_is_taken_for_records_the_writer_writes(tmp_path):
    """Real records never need the full parse (that is what keeps big steps fast), even when the task
    holds a `samples` list of its own."""
    episodes = step_episodes(1)
    episodes[0].task.metadata.update({"samples": [1, 2], "metrics": {"a": 1}})
    path = RolloutLog(tmp_path).write(1, "train", episodes, tiny_tokenizer())
    data = path.read_bytes()
    entry = index_line(data.splitlines(keepends=True)[0], 0, 0)
    head_range, conversation_range = entry.search_ranges
    assert data.count(b',"samples":[', 0, head_range[1]) == 1  # the task's own, skipped
    assert data[head_range[1]:].startswith(b',"samples":[{"agent"')  # two ranges: token arrays left out
    assert data[conversation_range[0]:].startswith(b',"messages":[')
    assert entry.summary == full_summaries(path)[0]


def test_appended_episodes_are_indexed_and_half_written_lines_wait(tmp_path):
    path = RolloutLog(tmp_path).write(1, "train", step_episodes(1, 2), tiny_tokenizer())
    index = index_of(path)
    assert len(index) == 2
    whole = path.read_bytes()
    RolloutLog(tmp_path).write(1, "train", step_episodes(1, 3), tiny_tokenizer())
    added = path.read_bytes()[len(whole):]
    path.write_bytes(whole + added[:100])  # a writer in the middle of a line
    index.refresh()
    assert len(index) == 2
    path.write_bytes(whole + added)
    index.refresh()
    assert len(index) == 5
    assert [entry.summary["index"] for entry in index.entries] == [0, 1, 2, 3, 4]
    assert [entry.summary for entry in index.entries] == full_summaries(path)


def test_a_rewritten_or_truncated_file_is_indexed_afresh(tmp_path):
    path = RolloutLog(tmp_path).write(1, "train", step_episodes(1, 4), tiny_tokenizer())
    index = index_of(path)
    path.unlink()
    RolloutLog(tmp_path).write(1, "train", step_episodes(1, 2), tiny_tokenizer())
    index.refresh()
    assert len(index) == 2
    one_line = path.read_bytes().splitlines(keepends=True)[0]
    path.write_bytes(one_line)  # truncated in place: the same file, shorter
    assert index.select(Query(text="what is"))[1] == 1  # a stale index searches without crashing
    index.refresh()
    assert len(index) == 1 and index.entries[0].end == len(one_line)


def test_a_corrupt_line_is_shown_as_unreadable_and_the_rest_still_open(tmp_path):
    path = RolloutLog(tmp_path).write(1, "train", step_episodes(1, 2), tiny_tokenizer())
    first, second = path.read_bytes().splitlines()
    path.write_bytes(first + b"\n" + second[: len(second) // 2] + b"\n\n" + second + b"\n")
    index = index_of(path)
    statuses = [entry.summary["status"] for entry in index.entries]
    assert statuses == ["ok", "unreadable", "ok"]
    assert "Line 2 of the file is not a JSON object" in index.entries[1].summary["error"]
    assert json.loads(index.record_bytes(2))["episode_id"] == "step1-episode1"
    rows, matched = index.select(Query(status="failed"))
    assert matched == 1 and rows[0]["index"] == 1


def test_missing_values_sort_last_both_ways(tmp_path):
    path = RolloutLog(tmp_path).write(1, "train", step_episodes(1, 3), tiny_tokenizer())
    path.write_bytes(path.read_bytes() + b"garbage\n")  # its reward is missing
    index = index_of(path)
    for descending in (False, True):
        rows, _ = index.select(Query(sort="reward", descending=descending))
        assert rows[-1]["status"] == "unreadable"
        rewards = [row["reward"] for row in rows[:-1]]
        assert rewards == sorted(rewards, reverse=descending)
