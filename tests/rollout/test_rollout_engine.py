"""The rollout engine and the ModelTuner against the real gateway (scripted engine, tiny tokenizer).

Workflows use the real `openai` client, in-process and over loopback HTTP. Failure isolation: one
batch holds workflows that raise, hang, swallow cancellation, return garbage or exit, judges that
raise, hang or return garbage, and a model that talks nonsense; every other episode still succeeds.
The tests marked `in_both` also run with the workflows in two worker processes
(`rollout.workflow_processes: 2`): the same episodes must come back.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time

import openai
import pytest

from agenttune import Judge, JudgeInput, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.errors import UserError
from agenttune.rollout.metrics import step_metrics
from agenttune.rollout.rollout_engine import RolloutEngine, sampling_params
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EnvironmentFailure, EpisodeStatus

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]
TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"word": "sky"}}\n</tool_call>'
ANSWER = "The answer is blue."


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


# The worker-process half starts processes: slow (the `fast` nox session leaves it out).
in_both = pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.slow)],
                                  ids=["in-process", "two-workflow-processes"])


def generated(tokenizer, *replies: str) -> list[int]:
    """The ids the scripted engine generates for these text replies."""
    return [token for reply in replies
            for token in tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]]


def tasks(*ids: str, **metadata) -> list[Task]:
    return [Task(task_id=task_id, query=f"Question {task_id}?", metadata={"mode": task_id, **metadata})
            for task_id in ids]


class AnswerJudge(Judge):
    """1.0 when the handed final answer mentions 'blue'."""

    name = "answer_test"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = str(judge_input.final_answer)
        return JudgeResult(reward=float("blue" in answer), success="blue" in answer,
                           details={"answer": answer, "messages": len(judge_input.messages)})


class ToolWorkflow(Workflow):
    """A two-call tool-using agent on the async OpenAI client: call the tool, then answer."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        messages = [{"role": "user", "content": task.query}]
        first = (await client.chat.completions.create(model=tuner.model_name, messages=messages,
                                                      tools=TOOLS)).choices[0].message
        call = first.tool_calls[0]
        messages += [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "blue"})}]
        final = (await client.chat.completions.create(model=tuner.model_name, messages=messages,
                                                      tools=TOOLS)).choices[0].message
        tuner.update_judge_input_dictionary(final_answer=final.content)
        return WorkflowOutput(metadata={"final_answer": final.content})


@in_both
async def test_groups_merge_tool_turns_into_exact_samples_and_judge_them(tokenizer, processes):
    engine = ScriptedEngine([TOOL_CALL, ANSWER], tokenizer=tokenizer, cycle=True)
    config = tiny_config(rollout={"num_repeat": 3, "max_env_worker": 1,  # one at a time: replies alternate
                                  "workflow_processes": processes})
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, ToolWorkflow, AnswerJudge()) as rollout:
        episodes = await rollout.run_tasks(tasks("a", "b"))

    assert [(e.task.task_id, e.repeat_index) for e in episodes] == [("a", 0), ("a", 1), ("a", 2),
                                                                     ("b", 0), ("b", 1), ("b", 2)]
    assert len({e.group_id for e in episodes[:3]}) == 1 and episodes[0].group_id != episodes[3].group_id
    assert len({e.episode_id for e in episodes}) == 6
    expected_generated = generated(tokenizer, TOOL_CALL, ANSWER)
    for episode in episodes:
        assert episode.status is EpisodeStatus.OK, episode.error
        assert (episode.reward, episode.success) == (1.0, True)
        assert episode.judge_details == {"answer": ANSWER, "messages": 4}
        assert episode.output == {"final_answer": ANSWER}
        assert episode.metrics["calls"] == 2
        [sample] = episode.samples  # the second call extends the first: one merged sample
        assert sample.num_calls == 2
        trained = [token for token, mask in zip(sample.response_ids, sample.loss_mask, strict=True) if mask]
        assert trained == expected_generated
        # The tool result between the calls is context: in the sample, never trained.
        context = tokenizer.decode([t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if not m])
        assert '{"sky": "blue"}' in context
        assert [m["role"] for m in episode.messages] == ["user", "assistant", "tool", "assistant"]


class BarrierWorkflow(Workflow):
    """Waits until every episode of the batch is inside `execute`, then asks one question."""

    running = 0
    peak = 0
    everyone_in: asyncio.Event
    expected = 0

    async def execute(self, task, tuner):
        cls = type(self)
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        if cls.running >= cls.expected:
            cls.everyone_in.set()
        try:
            await asyncio.wait_for(cls.everyone_in.wait(), timeout=60)
            client = tuner.as_async_openai_client()
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": task.query}])
            return WorkflowOutput(reward=1.0, metadata={"final_answer": reply.choices[0].message.content})
        finally:
            cls.running -= 1


def echo_task_id(tokenizer):
    """A responder that answers each prompt with the task id written in it (catches crossed episodes)."""

    def respond(prompt_ids, sampling):
        task_id = re.findall(r"Question (t\d+)\?", tokenizer.decode(prompt_ids))[-1]
        return f"It is {task_id}."

    return respond


@pytest.mark.slow
async def test_more_than_a_hundred_episodes_run_at_once_without_crossing(tokenizer):
    count = 120
    BarrierWorkflow.running = BarrierWorkflow.peak = 0
    BarrierWorkflow.expected = count
    BarrierWorkflow.everyone_in = asyncio.Event()
    engine = ScriptedEngine(tokenizer=tokenizer, responder=echo_task_id(tokenizer))
    config = tiny_config(rollout={"num_repeat": 2, "max_env_worker": count})
    async with running_gateway(engine, config=config) as gateway:
        episodes = await RolloutEngine(config, gateway, BarrierWorkflow).run_tasks(
            tasks(*(f"t{i}" for i in range(count // 2))))

    assert len(episodes) == count
    assert BarrierWorkflow.peak == count  # all of them were in flight together
    for episode in episodes:
        assert episode.status is EpisodeStatus.OK, episode.error
        assert episode.output["final_answer"] == f"It is {episode.task.task_id}."
        assert episode.messages[-1]["content"] == f"It is {episode.task.task_id}."
        assert episode.samples[0].response_ids == generated(tokenizer, f"It is {episode.task.task_id}.")


class CountingWorkflow(Workflow):
    running = 0
    peak = 0

    async def execute(self, task, tuner):
        cls = type(self)
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        await asyncio.sleep(0.01)
        cls.running -= 1
        return WorkflowOutput(reward=0.5)


async def test_max_env_worker_bounds_the_episodes_in_flight(tokenizer):
    CountingWorkflow.running = CountingWorkflow.peak = 0
    config = tiny_config(rollout={"num_repeat": 4, "max_env_worker": 3})
    async with running_gateway(ScriptedEngine(tokenizer=tokenizer), config=config) as gateway:
        episodes = await RolloutEngine(config, gateway, CountingWorkflow).run_tasks(tasks("a", "b", "c"))
    assert CountingWorkflow.peak == 3
    assert [e.reward for e in episodes] == [0.5] * 12
    assert all(e.success for e in episodes)  # a positive reward without `success` counts as solved


release_threads = threading.Event()
release_stubborn = threading.Event()


class MixedWorkflow(Workflow):
    """Behaves according to the task id; most of these are failures that must stay in their episode."""

    async def execute(self, task, tuner):
        mode = task.metadata["mode"]
        if mode == "raise":
            raise ValueError("the agent tripped")
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "stubborn":  # swallows cancellation: must be abandoned, not awaited forever
            while not release_stubborn.is_set():  # (set when the test ends, so the loop can close)
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    pass
        if mode == "garbage":
            return "not an output"
        if mode == "nan":
            return WorkflowOutput(reward=float("nan"))
        if mode == "cancel":
            raise asyncio.CancelledError()
        if mode == "exit":
            sys.exit(3)
        if mode == "no_reward":
            return WorkflowOutput()
        client = tuner.as_async_openai_client()
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.query}],
                                                     tools=TOOLS)
        if mode == "engine":
            raise AssertionError("the engine was supposed to fail")
        answer = reply.choices[0].message.content
        tuner.update_judge_input_dictionary(final_answer=answer)
        return WorkflowOutput(reward=task.metadata.get("reward"), metadata={"final_answer": answer})


class SyncMixedWorkflow(Workflow):
    """A sync workflow (run in a thread) with the sync client; `hang` blocks its thread."""

    def execute(self, task, tuner):
        if task.metadata["mode"] == "sync_hang":
            release_threads.wait(60)
            return WorkflowOutput(reward=1.0)
        if task.metadata["mode"] == "sync_exit":
            sys.exit(4)
        reply = tuner.as_openai_client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.query}])
        return WorkflowOutput(reward=1.0, metadata={"final_answer": reply.choices[0].message.content})


class MoodyJudge(Judge):
    name = "moody_test"

    async def judge(self, judge_input):
        mode = judge_input.task.metadata["mode"]
        if mode == "judge_raise":
            raise RuntimeError("the judge tripped")
        if mode == "judge_hang":
            await asyncio.sleep(3600)
        if mode == "judge_garbage":
            return "five stars"
        return JudgeResult(reward=1.0, success=True)


def replies_by_mode(tokenizer):
    """Sane answers, except nonsense for `mad` and an unreadable tool call for `bad_tool`."""

    def respond(prompt_ids, sampling):
        text = tokenizer.decode(prompt_ids)
        if "Question mad?" in text:
            return "la " * 60
        if "Question bad_tool?" in text:
            return "<tool_call>\n{not json\n</tool_call>"
        if "Question engine?" in text:
            raise RuntimeError("the GPU caught fire")
        return "It is blue."

    return respond


@pytest.mark.slow
@in_both
async def test_failures_stay_in_their_episode(tokenizer, monkeypatch, processes):
    monkeypatch.setattr("agenttune.rollout.rollout_engine.CANCEL_GRACE_S", 0.2)
    config = tiny_config(rollout={"num_repeat": 1, "max_env_worker": 32, "episode_timeout": 1.0,
                                  "agent_madness_reward": -1.0, "workflow_processes": processes},
                         judge={"timeout": 1.0})
    modes = ["ok", "raise", "hang", "stubborn", "garbage", "nan", "cancel", "exit", "no_reward", "engine",
             "mad", "bad_tool", "judge_raise", "judge_hang", "judge_garbage"]
    engine = ScriptedEngine(tokenizer=tokenizer, responder=replies_by_mode(tokenizer))
    try:
        async with running_gateway(engine, config=config) as gateway:
            async with RolloutEngine(config, gateway, MixedWorkflow, MoodyJudge()) as rollout:
                episodes = {e.task.task_id: e for e in await rollout.run_tasks(tasks(*modes))}
            # without a judge, a workflow that sets no reward is an error of that episode alone
            async with RolloutEngine(config, gateway, MixedWorkflow) as rollout:
                no_judge = await rollout.run_tasks(tasks("no_reward") + tasks("ok", reward=0.25))
    finally:
        release_stubborn.set()

    expected = {
        "ok": (EpisodeStatus.OK, None),
        "raise": (EpisodeStatus.WORKFLOW_ERROR, "ValueError: the agent tripped"),
        "hang": (EpisodeStatus.TIMEOUT, "ran past rollout.episode_timeout=1s"),
        "stubborn": (EpisodeStatus.TIMEOUT, "did not stop within 0.2s of being cancelled"),
        "garbage": (EpisodeStatus.WORKFLOW_ERROR, "MixedWorkflow.execute returned 'not an output' (str)"),
        "nan": (EpisodeStatus.WORKFLOW_ERROR, "non-finite reward"),
        "cancel": (EpisodeStatus.CANCELLED, "cancelled"),
        "exit": (EpisodeStatus.WORKFLOW_ERROR, "the workflow called sys.exit(3)"),
        "no_reward": (EpisodeStatus.OK, None),  # the judge scores it
        "engine": (EpisodeStatus.ENGINE_ERROR, "the GPU caught fire"),
        "mad": (EpisodeStatus.MADNESS, None),
        "bad_tool": (EpisodeStatus.MADNESS, None),
        "judge_raise": (EpisodeStatus.JUDGE_ERROR, "the judge raised RuntimeError: the judge tripped"),
        "judge_hang": (EpisodeStatus.JUDGE_TIMEOUT, "the judge ran past judge.timeout=1s"),
        "judge_garbage": (EpisodeStatus.JUDGE_ERROR, "MoodyJudge.judge returned 'five stars'"),
    }
    for mode, (status, message) in expected.items():
        episode = episodes[mode]
        assert episode.status is status, (mode, episode.status, episode.error)
        if message is not None:
            assert message in episode.error, (mode, episode.error)
        if status.failed:
            assert episode.reward == 0.0 and not episode.success
    assert (episodes["ok"].reward, episodes["no_reward"].reward) == (1.0, 1.0)
    assert episodes["mad"].reward == -1.0 and episodes["mad"].judge_details["madness"] == ["nonsense"]
    assert episodes["mad"].judge_details["judge_reward"] == 1.0
    assert episodes["bad_tool"].judge_details["madness"] == ["wrong_toolcall"]
    # a failed episode keeps what it did record: the engine failure came after the user turn
    assert episodes["engine"].metrics["engine_errors"] == 1

    assert no_judge[0].status is EpisodeStatus.JUDGE_ERROR
    assert "no judge is configured" in no_judge[0].error
    assert (no_judge[1].status, no_judge[1].reward) == (EpisodeStatus.OK, 0.25)

    metrics = step_metrics(list(episodes.values()))
    assert metrics["failures/timeout"] == 2 and metrics["failures/judge_error"] == 2
    assert metrics["failures/judge_timeout"] == 1
    assert metrics["madness_rate"] == pytest.approx(2 / 15)


@pytest.mark.slow
@in_both
async def test_sync_workflows_run_in_threads_and_a_hung_thread_only_times_out_its_episode(tokenizer, processes):
    config = tiny_config(rollout={"num_repeat": 2, "max_env_worker": 8, "episode_timeout": 1.0,
                                  "workflow_processes": processes})
    engine = ScriptedEngine(["It is blue."], tokenizer=tokenizer, cycle=True)
    try:
        async with running_gateway(engine, config=config) as gateway, \
                RolloutEngine(config, gateway, SyncMixedWorkflow) as rollout:
            episodes = await rollout.run_tasks(tasks("sync_hang", "sync_exit", "sync_ok"))
    finally:
        release_threads.set()
    statuses = [(e.task.task_id, e.status) for e in episodes]
    assert statuses == [("sync_hang", EpisodeStatus.TIMEOUT)] * 2 + [("sync_exit", EpisodeStatus.WORKFLOW_ERROR)] * 2 \
        + [("sync_ok", EpisodeStatus.OK)] * 2
    assert "SystemExit(4)" in episodes[2].error
    assert episodes[4].output == {"final_answer": "It is blue."} and episodes[4].metrics["calls"] == 1


async def test_closed_episodes_refuse_late_calls(tokenizer):
    """A workflow that leaks its client past the episode's end gets 401, and nothing is recorded."""
    leaked = []

    class Leaky(Workflow):
        async def execute(self, task, tuner):
            leaked.append(tuner)
            return WorkflowOutput(reward=1.0)

    config = tiny_config(rollout={"num_repeat": 1})
    async with running_gateway(ScriptedEngine(["hi"], tokenizer=tokenizer), config=config) as gateway:
        [episode] = await RolloutEngine(config, gateway, Leaky).run_tasks(tasks("a"))
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=leaked[0].api_key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
        await client.close()
    assert episode.samples == [] and leaked[0].channel.metrics()["calls"] == 0


async def test_cancelling_the_batch_cancels_the_episodes_and_closes_their_channels(tokenizer):
    started = asyncio.Event()
    tuners = []

    class Waits(Workflow):
        async def execute(self, task, tuner):
            tuners.append(tuner)
            if len(tuners) == 4:
                started.set()
            await asyncio.sleep(3600)

    config = tiny_config(rollout={"num_repeat": 2, "max_env_worker": 4})
    async with running_gateway(ScriptedEngine(tokenizer=tokenizer), config=config) as gateway:
        batch = asyncio.create_task(RolloutEngine(config, gateway, Waits).run_tasks(tasks("a", "b", "c")))
        await asyncio.wait_for(started.wait(), 10)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        assert len(tuners) == 4  # the waiting episodes never started
        assert all(tuner.channel.closed for tuner in tuners)


# -- the tuner ------------------------------------------------------------------------------------------


class MultiAgentWorkflow(Workflow):
    """A solver (async client, in-process) and a critic (sync client over HTTP, in a thread)."""

    async def execute(self, task, tuner):
        solver = tuner.as_model("openai", agent="solver")  # the built-in openai framework
        critic = tuner.as_openai_client(agent="critic", http=True)
        answer = (await solver.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task.query}])).choices[0].message.content
        verdict = await asyncio.to_thread(lambda: critic.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"Is '{answer}' right?"}]).choices[0].message.content)
        tuner.update_judge_input_dictionary(final_answer=answer, verdict=verdict)
        return WorkflowOutput()


class HandedJudge(Judge):
    name = "handed_test"

    def judge(self, judge_input):
        return JudgeResult(reward=1.0, details=dict(judge_input.handed))


async def test_agents_get_their_own_timelines_and_trainable_targets_pick_them(tokenizer):
    config = tiny_config(rollout={"num_repeat": 1, "trainable_targets": ["solver"]})
    engine = ScriptedEngine(["Blue.", "Yes."], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine, config=config) as gateway:
        async with RolloutEngine(config, gateway, MultiAgentWorkflow, HandedJudge()) as rollout:
            [episode] = await rollout.run_tasks(tasks("a"))
    assert episode.status is EpisodeStatus.OK, episode.error
    assert episode.judge_details == {"final_answer": "Blue.", "verdict": "Yes."}
    by_agent = {sample.agent: sample for sample in episode.samples}
    assert set(by_agent) == {"solver", "critic"}
    assert by_agent["solver"].trainable and not by_agent["critic"].trainable
    assert by_agent["solver"].response_ids == generated(tokenizer, "Blue.")
    assert episode.trainable_samples == [by_agent["solver"]]


async def test_tuner_endpoint_keys_and_framework_lookup(tokenizer):
    seen = {}

    class Inspect(Workflow):
        async def execute(self, task, tuner):
            seen.update(base_url=tuner.base_url, key=tuner.api_key, critic=tuner.api_key_for("critic"),
                        task=tuner.task, model=tuner.model_name, overflow=tuner.context_overflow)
            with pytest.raises(UserError, match="Agent name 'a.b' is not allowed"):
                tuner.api_key_for("a.b")
            with pytest.raises(UserError, match="unknown agent framework 'no_such_framework'"):
                tuner.as_model("no_such_framework")
            # the plain HTTP address and key work for any client, e.g. one in another process
            client = openai.AsyncOpenAI(base_url=tuner.base_url, api_key=tuner.api_key, max_retries=0)
            reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            await client.close()
            return WorkflowOutput(reward=1.0, metadata={"final_answer": reply.choices[0].message.content})

    config = tiny_config(rollout={"num_repeat": 1})
    async with running_gateway(ScriptedEngine(["Hello."], tokenizer=tokenizer), config=config) as gateway:
        [episode] = await RolloutEngine(config, gateway, Inspect).run_tasks(tasks("a"))
        assert seen["base_url"] == gateway.base_url and seen["base_url"].startswith("http://127.0.0.1:")
    assert episode.status is EpisodeStatus.OK, episode.error
    assert seen["critic"] == f"{seen['key']}.critic" and len(seen["key"]) >= 32
    assert seen["task"].task_id == "a" and seen["model"] == "tiny://default" and seen["overflow"] is False
    assert episode.output == {"final_answer": "Hello."}


class OverflowWorkflow(Workflow):
    """Keeps the conversation going until the gateway refuses a call at a limit (the context no longer
    fits, or the turns ran out) and returns normally, as the tuner documents."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        messages = [{"role": "user", "content": task.query}]
        stopped_by = None
        for _ in range(50):
            try:
                reply = await client.chat.completions.create(model="m", messages=messages)
            except openai.BadRequestError as error:
                stopped_by = error.code
                break
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "Tell me more about it, please."}]
        return WorkflowOutput(reward=float(tuner.context_overflow or tuner.turn_limit),
                              metadata={"turns": len(messages) // 2, "stopped_by": stopped_by})


@in_both
async def test_context_overflow_reaches_the_workflow_and_the_metrics(tokenizer, processes):
    config = tiny_config(model={"max_model_len": 160}, rollout={"num_repeat": 2, "max_response_length_in_one_turn": 16,
                                                                "workflow_processes": processes})
    engine = ScriptedEngine(["Some words about it."], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, OverflowWorkflow) as rollout:
        episodes = await rollout.run_tasks(tasks("a"))
    for episode in episodes:
        assert episode.status is EpisodeStatus.OK and episode.reward == 1.0
        assert 1 < episode.output["turns"] < 50 and episode.output["stopped_by"] == "context_length_exceeded"
        assert episode.metrics["context_overflow"] == 1
    assert step_metrics(episodes)["overflow_rate"] == 1.0


def test_sampling_params_follow_the_rollout_config():
    rollout = tiny_config(rollout={"temperature": 0.7, "val_temperature": 0.0, "top_p": 0.9, "top_k": 20,
                                   "max_response_length_in_one_turn": 99}).rollout
    train, validation = sampling_params(rollout), sampling_params(rollout, validation=True)
    assert (train.temperature, train.top_p, train.top_k, train.max_tokens) == (0.7, 0.9, 20, 99)
    assert validation.temperature == 0.0 and validation.max_tokens == 99


async def test_episode_timings_are_recorded(tokenizer):
    class Slow(Workflow):
        async def execute(self, task, tuner):
            await asyncio.sleep(0.05)
            return WorkflowOutput(reward=1.0)

    config = tiny_config(rollout={"num_repeat": 1})
    before = time.time()
    async with running_gateway(ScriptedEngine(tokenizer=tokenizer), config=config) as gateway:
        [episode] = await RolloutEngine(config, gateway, Slow).run_tasks(tasks("a"))
    assert before <= episode.started_at <= time.time()
    assert episode.duration_s >= 0.05 and episode.metrics["workflow_s"] >= 0.05


class TalksForever(Workflow):
    """An agent framework's behaviour (AgentScope 1.x/2.x): it never stops on its own, and the gateway's
    400 at a limit (context overflow, turn limit) propagates out of the agent."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        messages = [{"role": "user", "content": task.query}]
        for _ in range(50):
            reply = await client.chat.completions.create(model="m", messages=messages)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "Tell me more about it, please."}]
            tuner.update_judge_input_dictionary(final_answer=reply.choices[0].message.content)
        return WorkflowOutput(metadata={"final_answer": "never"})


class OverflowJudge(Judge):
    def judge(self, judge_input):
        return JudgeResult(reward=0.25 if judge_input.handed.get("final_answer") else 0.0)


@in_both
@pytest.mark.parametrize("configured", [None, -0.5])
async def test_a_workflow_that_raises_on_context_overflow_ends_cleanly_with_its_samples(tokenizer, processes,
                                                                                      configured):
    """Issue 24: status context_overflow (not workflow_error), samples kept, reward from the judge or configured."""
    config = tiny_config(model={"max_model_len": 160},
                         rollout={"num_repeat": 2, "max_response_length_in_one_turn": 16,
                                  "workflow_processes": processes, "context_overflow_reward": configured})
    engine = ScriptedEngine(["Some words about it."], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, TalksForever, OverflowJudge()) as rollout:
        episodes = await rollout.run_tasks(tasks("a"))
    for episode in episodes:
        assert episode.status is EpisodeStatus.CONTEXT_OVERFLOW and not episode.status.failed
        assert "context_length_exceeded" in episode.error or "maximum context length" in episode.error
        assert episode.samples and episode.samples[0].num_calls >= 2  # what was generated is kept
        assert episode.reward == (0.25 if configured is None else configured)


@in_both
@pytest.mark.parametrize("configured", [None, -1.0])
async def test_a_call_beyond_max_turns_is_refused_and_ends_the_episode(tokenizer, processes, configured):
    """Issue 23 item 3: the (max_turns + 1)-th call gets a 400; the episode ends with status turn_limit,
    its samples kept, scored by the judge or rollout.turn_limit_reward."""
    config = tiny_config(rollout={"num_repeat": 2, "max_turns": 3, "workflow_processes": processes,
                                  "turn_limit_reward": configured})
    engine = ScriptedEngine(["Some words."], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, TalksForever, OverflowJudge()) as rollout:
        episodes = await rollout.run_tasks(tasks("a"))
    for episode in episodes:
        assert episode.status is EpisodeStatus.TURN_LIMIT and not episode.status.failed
        assert "max_turns_exceeded" in episode.error or "rollout.max_turns" in episode.error
        assert episode.metrics["calls"] == 3 and episode.metrics["turn_limit"] == 1
        assert [sample.num_calls for sample in episode.samples] == [3]  # merged, trained
        assert episode.reward == (0.25 if configured is None else configured)
    assert step_metrics(episodes)["turn_limit_rate"] == 1.0


async def test_a_workflow_that_stops_at_the_turn_limit_ends_normally(tokenizer):
    config = tiny_config(rollout={"num_repeat": 1, "max_turns": 2})
    engine = ScriptedEngine(["Some words."], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, OverflowWorkflow) as rollout:
        [episode] = await rollout.run_tasks(tasks("a"))
    assert episode.status is EpisodeStatus.OK and episode.reward == 1.0
    assert episode.output == {"turns": 2, "stopped_by": "max_turns_exceeded"} and episode.metrics["turn_limit"] == 1


async def test_the_turn_limit_counts_each_agent_and_calls_in_flight(tokenizer):
    config = tiny_config(rollout={"max_turns": 2})
    engine = ScriptedEngine(["Hi."], tokenizer=tokenizer, cycle=True, delay=0.05)
    async with running_gateway(engine, config=config) as gateway:
        channel = gateway.open_episode("ep")
        client = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key(), max_retries=0)
        critic = openai.AsyncOpenAI(base_url=channel.base_url, api_key=channel.api_key("critic"), max_retries=0)
        messages = [{"role": "user", "content": "Hello"}]
        results = await asyncio.gather(*(client.chat.completions.create(model="m", messages=messages)
                                         for _ in range(3)), return_exceptions=True)
        refused = [result for result in results if isinstance(result, openai.BadRequestError)]
        assert len(refused) == 1 and refused[0].code == "max_turns_exceeded"
        assert (await critic.chat.completions.create(model="m", messages=messages)).choices[0].message.content
        assert channel.turn_limit and channel.metrics()["turn_limit"] == 1 and channel.metrics()["calls"] == 3


class EnvironmentDownWorkflow(Workflow):
    """Calls the model once, then its environment fails it (an environment client's EnvironmentFailure)."""

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client()
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task.query}])
        if task.task_id == "down":
            raise EnvironmentFailure("the environment server at http://127.0.0.1:1 did not answer step within 1s")
        raise ValueError("the agent's own bug")


async def test_an_environment_failure_is_counted_apart_from_the_workflows_own_errors(tokenizer):
    config = tiny_config(rollout={"num_repeat": 1})
    engine = ScriptedEngine(["Hi."], tokenizer=tokenizer, cycle=True)
    async with running_gateway(engine, config=config) as gateway, \
            RolloutEngine(config, gateway, EnvironmentDownWorkflow) as rollout:
        down, buggy = await rollout.run_tasks(tasks("down", "buggy"))
    assert down.status is EpisodeStatus.ENVIRONMENT_ERROR and "did not answer step" in down.error
    assert buggy.status is EpisodeStatus.WORKFLOW_ERROR
    assert down.samples  # what the model generated before the environment failed is kept in the record
    metrics = step_metrics([down, buggy])
    assert metrics["failures/environment_error"] == 1.0 and metrics["failures/workflow_error"] == 1.0
