"""The agenttune agent loop inside verl's own agent-loop workers (the V1 trainer's and the legacy one).

The workers are verl's real classes, built from the config file the launcher writes and loaded the
way `verl.trainer.main_ppo` loads it; they register the loop from the agent-loop YAML and create it
through hydra for every trajectory. Only the vLLM servers behind `server_manager` are faked.
"""

from __future__ import annotations

import json

import pytest
from agenttune_verl.agent_loop import WorkerRuntime
from agenttune_verl.launch import prepare, verl_dir
from agenttune_verl.outputs import FAILED_EPISODE_DROPPED
from conftest import CALCULATOR, FINAL_ANSWER, TOOL_CALL, FakeServerManager, fake_logprob, load_like_main_ppo

from agenttune.plugin_api import RolloutLog, prepare_run, read_records, resolve

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.fixture
def prepared_run(agent_config, tmp_path):
    """An agenttune run directory prepared for verl, as `agenttune train --backbone verl` prepares it."""

    def build(*overrides, workflow=CALCULATOR):
        config = agent_config(*overrides, workflow=workflow)
        run = prepare_run(config, tmp_path / "run")
        prepare(run, resolve(config))
        return run

    return build


@pytest.fixture
async def teardown_runtimes():
    yield
    await WorkerRuntime.close_all()


def dataset_rows(verl_config, split_files, tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    dataset = RLHFDataset(data_files=split_files, tokenizer=tokenizer, config=verl_config.data)
    return [dataset[i] for i in range(len(dataset))]


def v1_worker(run, tokenizer, monkeypatch, answers):
    """verl's V1 agent-loop worker for `run`, its model answering `answers` in turn: (verl's config, the
    fake server, the worker, what the worker stores)."""
    verl_config = load_like_main_ppo(run)
    server = FakeServerManager(tokenizer, answers)
    return (verl_config, server, *tq_worker(verl_config, server, monkeypatch))


def tq_worker(verl_config, server, monkeypatch):
    """verl's V1 `AgentLoopWorkerTQ`, in this process, with its TransferQueue calls captured."""
    from verl.trainer.ppo.v1 import agent_loop_tq

    stored = {"puts": [], "status": []}

    async def kv_batch_put(*, keys, fields, tags, partition_id):
        stored["puts"].append({"keys": keys, "fields": fields, "tags": tags, "partition": partition_id})

    async def kv_put(*, key, partition_id, tag):
        stored["status"].append(tag["status"])

    monkeypatch.setattr(agent_loop_tq.tq, "init", lambda *args, **kwargs: None)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_put", kv_put)
    worker_cls = next(cls for cls in agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class.__mro__
                      if cls.__name__ == "AgentLoopWorkerTQ")  # the class under Ray's actor wrapper
    return worker_cls(verl_config, server), stored


def expected_merge(server, episode_calls):
    """Prompt, response, mask and logprobs of one merged two-call sample, from what the server saw."""
    first, second = episode_calls
    prompt = first["prompt_ids"]
    glue = second["prompt_ids"][len(prompt) + len(first["token_ids"]):]
    assert second["prompt_ids"][:len(prompt) + len(first["token_ids"])] == prompt + first["token_ids"]
    response = first["token_ids"] + glue + second["token_ids"]
    mask = [1] * len(first["token_ids"]) + [0] * len(glue) + [1] * len(second["token_ids"])
    logprobs = [fake_logprob(t) if m else 0.0 for t, m in zip(response, mask, strict=True)]
    return prompt, response, mask, logprobs


async def trajectory(step, index, validate=False):
    """What verl's worker computes for a prompt before running its sessions."""
    from verl.experimental.agent_loop.agent_loop import get_trajectory_info

    return (await get_trajectory_info(step, [index], validate))[0]


def calls_by_request(server):
    grouped: dict[str, list] = {}
    for call in server.calls:
        grouped.setdefault(call["request_id"], []).append(call)
    return grouped


async def test_v1_worker_runs_the_tool_agent_and_stores_exact_tokens(prepared_run, tiny_tokenizer, monkeypatch,
                                                                    teardown_runtimes):
    run = prepared_run()
    verl_config, server, worker, stored = v1_worker(run, tiny_tokenizer, monkeypatch, [TOOL_CALL, FINAL_ANSWER])
    row = dataset_rows(verl_config, verl_config.data.train_files, worker.tokenizer)[0]

    prompt = {**row, "uid": "uid-0", "global_steps": 3, "agent_name": row["agent_name"]}
    await worker._run_prompt(prompt, dict(SAMPLING), trajectory=await trajectory(3, row["index"]))

    assert stored["status"] == ["running", "finished"]
    # rollout.n = num_repeat = 2 sessions, each one episode with two calls on one sticky request id
    episodes = calls_by_request(server)
    assert len(episodes) == 2 and all(len(calls) == 2 for calls in episodes.values())
    assert all(call["sampling_params"]["max_tokens"] == 64 for call in server.calls)
    keys = sorted(key for put in stored["puts"] for key in put["keys"])
    assert keys == ["uid-0_0_0", "uid-0_1_0"]  # one merged output per session

    for put in stored["puts"]:
        fields = put["fields"][0]
        calls = next(calls for calls in episodes.values() if calls[0]["prompt_ids"] == fields["prompts"].tolist())
        prompt_ids, response, mask, logprobs = expected_merge(server, calls)
        assert fields["prompts"].tolist() == prompt_ids
        assert fields["responses"].tolist() == response
        assert fields["response_mask"].tolist() == mask
        assert fields["rollout_log_probs"].tolist() == pytest.approx(logprobs)
        assert fields["rm_scores"].tolist() == [0.0] * (len(response) - 1) + [1.0]  # the judge's reward
        assert fields["num_turns"] == 5  # system, user, assistant (tool call), tool, assistant
        tag = put["tags"][0]
        assert tag["status"] == "success" and tag["min_global_steps"] == tag["max_global_steps"] == 3
        assert fields["extra_fields"]["reward_extra_info"] == {"acc": 1.0, "failed": 0.0}

    decoded = tiny_tokenizer.decode(stored["puts"][0]["fields"][0]["responses"].tolist())
    assert "<tool_response>" in decoded and "5" in decoded and FINAL_ANSWER in decoded

    records = list(read_records(RolloutLog.for_run(run).path(3, "train")))
    assert len(records) == 2 and {r.reward for r in records} == {1.0}
    assert records[0].samples[0].response_tokens  # token text for the log viewer
    assert records[0].metrics["truncation/samples_split"] == 0


async def test_split_timeline_becomes_several_outputs_for_the_v1_trainer(prepared_run, tiny_tokenizer, monkeypatch,
                                                                        teardown_runtimes):
    run = prepared_run(workflow="verl_agents:RewritingWorkflow")
    verl_config, server, worker, stored = v1_worker(run, tiny_tokenizer, monkeypatch, ["Five, I think.", "The answer is 5."])
    row = dataset_rows(verl_config, verl_config.data.train_files, worker.tokenizer)[1]

    await worker._run_prompt({**row, "uid": "u", "global_steps": 1}, dict(SAMPLING),
                             trajectory=await trajectory(1, row["index"]))

    keys = sorted(key for put in stored["puts"] for key in put["keys"])
    assert keys == ["u_0_0", "u_0_1", "u_1_0", "u_1_1"]  # two samples per session
    for put in stored["puts"]:
        assert [f["rm_scores"][-1].item() for f in put["fields"]] == [1.0, 1.0]  # the reward reaches both
        first, second = put["fields"]
        assert first["responses"].tolist() != second["responses"].tolist()
        assert all(set(f["response_mask"].tolist()) == {1} for f in put["fields"])  # generated tokens only


async def test_legacy_worker_batch_with_padding_and_a_split_sample(prepared_run, tiny_tokenizer, teardown_runtimes):
    """A merged sample longer than verl's limits is split at call boundaries, never cut inside a call:
    the tool call (longer than the 24-token response limit) fits in no part and is dropped, counted;
    the final answer is trained with its own full prompt, which holds the tool call as context."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    run = prepared_run("data.max_response_length=24", "data.max_prompt_length=1000",
                       "verl={trainer: {use_v1: false}}")
    verl_config = load_like_main_ppo(run)
    assert verl_config.trainer.use_v1 is False
    server = FakeServerManager(tiny_tokenizer, [TOOL_CALL, FINAL_ANSWER])
    worker = AgentLoopWorker(verl_config, server)
    rows = dataset_rows(verl_config, verl_config.data.train_files, worker.tokenizer)[:2]
    batch = DataProto.from_single_dict(collate_fn(rows)).repeat(repeat_times=2, interleave=True)
    batch.meta_info = {"global_steps": 2, "validate": False}

    output = await worker.generate_sequences(batch)

    assert output.batch["responses"].shape == (4, 24)
    assert output.batch["prompts"].shape == (4, 1000)
    mask = output.batch["response_mask"]
    assert mask.sum(dim=1).min() > 0  # the final answer is trained
    assert output.batch["rm_scores"].sum(dim=1).tolist() == [1.0] * 4
    for row in range(4):
        trained = output.batch["responses"][row][mask[row].bool()].tolist()
        assert FINAL_ANSWER in tiny_tokenizer.decode(trained)
        assert '"name": "add"' in tiny_tokenizer.decode(output.batch["prompts"][row].tolist())
    # the legacy worker does not tell agent loops the step: its episodes are logged under step 0
    records = list(read_records(RolloutLog.for_run(run).path(0, "train")))
    assert len(records) == 4
    for record in records:
        assert record.metrics["truncation/samples_split"] == 1
        assert record.metrics["truncation/calls_dropped"] == 1
        assert record.metrics["truncation/trained_tokens_dropped"] > 0


async def test_a_failed_episode_is_dropped_from_training_and_counted(prepared_run, tiny_tokenizer, monkeypatch,
                                                                    teardown_runtimes):
    """The documented rule: a failed training episode gives verl's V1 worker no output at all (its
    session stores nothing, so it is in no GRPO statistic), the group still completes, and the episode
    is in the rollout log with its status, its error and the drop counted."""
    run = prepared_run(workflow="verl_agents:CrashingWorkflow")
    verl_config, server, worker, stored = v1_worker(run, tiny_tokenizer, monkeypatch, [FINAL_ANSWER])
    row = dataset_rows(verl_config, verl_config.data.train_files, worker.tokenizer)[0]

    await worker._run_prompt({**row, "uid": "f", "global_steps": 5}, dict(SAMPLING),
                             trajectory=await trajectory(5, row["index"]))

    assert stored["status"] == ["running", "finished"]  # the group completes: no failure status, no refill
    assert server.calls == [] and stored["puts"] == []  # nothing to train, nothing stored
    records = list(read_records(RolloutLog.for_run(run).path(5, "train")))
    assert [r.status.value for r in records] == ["workflow_error", "workflow_error"]
    assert "the environment is down" in records[0].error
    assert [r.metrics[FAILED_EPISODE_DROPPED] for r in records] == [1.0, 1.0]


async def test_a_failure_after_model_calls_trains_none_of_its_tokens(prepared_run, tiny_tokenizer, monkeypatch,
                                                                    teardown_runtimes):
    run = prepared_run(workflow="verl_agents:FirstRepeatCrashesAfterAnswering")
    verl_config, server, worker, stored = v1_worker(run, tiny_tokenizer, monkeypatch, [FINAL_ANSWER])
    row = dataset_rows(verl_config, verl_config.data.train_files, worker.tokenizer)[0]

    await worker._run_prompt({**row, "uid": "m", "global_steps": 2}, dict(SAMPLING),
                             trajectory=await trajectory(2, row["index"]))

    assert len(server.calls) == 2  # both episodes generated
    assert stored["status"] == ["running", "finished"]
    keys = [key for put in stored["puts"] for key in put["keys"]]
    assert keys == ["m_1_0"]  # only the episode that finished: its group has one member for verl's GRPO
    [fields] = stored["puts"][0]["fields"]
    assert fields["extra_fields"]["agenttune_status"] == "ok" and fields["rm_scores"][-1].item() == 1.0
    records = {r.episode_id: r for r in read_records(RolloutLog.for_run(run).path(2, "train"))}
    failed = records["m-0"]
    assert failed.status.value == "workflow_error" and failed.metrics[FAILED_EPISODE_DROPPED] == 1.0
    assert failed.samples and sum(failed.samples[0].loss_mask) > 0  # it had generated tokens; none were stored
    assert FAILED_EPISODE_DROPPED not in records["m-1"].metrics


async def test_a_failed_validation_episode_still_counts_against_accuracy(prepared_run, tiny_tokenizer, monkeypatch,
                                                                        teardown_runtimes):
    run = prepared_run(workflow="verl_agents:CrashingWorkflow")
    verl_config, server, worker, stored = v1_worker(run, tiny_tokenizer, monkeypatch, [FINAL_ANSWER])
    row = dataset_rows(verl_config, verl_config.data.val_files, worker.tokenizer)[0]

    await worker._run_prompt({**row, "uid": "v", "global_steps": 0}, dict(SAMPLING),
                             trajectory=await trajectory(0, row["index"], validate=True))

    [put] = stored["puts"]
    assert put["partition"] == "val"
    [fields] = put["fields"]
    assert fields["response_mask"].tolist() == [0]  # an untrained placeholder that carries the reward
    assert fields["rm_scores"].tolist() == [0.0]
    prompt_text = tiny_tokenizer.decode(fields["prompts"].tolist())
    assert prompt_text.startswith("<|im_start|>user\nWhat is 2 + 3? (#0)")  # the task's prompt as context
    assert fields["extra_fields"]["agenttune_status"] == "workflow_error"
    [record] = read_records(RolloutLog.for_run(run).path(0, "validation"))
    assert FAILED_EPISODE_DROPPED not in record.metrics


async def test_the_legacy_trainer_gets_an_untrained_placeholder_for_a_failed_episode(prepared_run, tiny_tokenizer,
                                                                                    teardown_runtimes):
    """verl's legacy worker needs one output per episode: the failed one is all-masked, its tokens
    never trained, and its zero reward stays in its group's baseline."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    run = prepared_run("verl={trainer: {use_v1: false}}", workflow="verl_agents:FirstRepeatCrashesAfterAnswering")
    verl_config = load_like_main_ppo(run)
    server = FakeServerManager(tiny_tokenizer, [FINAL_ANSWER])
    worker = AgentLoopWorker(verl_config, server)
    rows = dataset_rows(verl_config, verl_config.data.train_files, worker.tokenizer)[:1]
    batch = DataProto.from_single_dict(collate_fn(rows)).repeat(repeat_times=2, interleave=True)
    batch.meta_info = {"global_steps": 2, "validate": False}

    output = await worker.generate_sequences(batch)

    statuses = list(output.non_tensor_batch["agenttune_status"])
    assert sorted(statuses) == ["ok", "workflow_error"] and len(server.calls) == 2
    for row, status in enumerate(statuses):
        trained_tokens = output.batch["response_mask"][row].sum().item()
        reward = output.batch["rm_scores"][row].sum().item()
        assert (trained_tokens > 0, reward) == ((True, 1.0) if status == "ok" else (False, 0.0))


async def test_validation_rows_use_verls_sampling_and_log_as_validation(prepared_run, tiny_tokenizer, monkeypatch,
                                                                        teardown_runtimes):
    run = prepared_run()
    verl_config, server, worker, stored = v1_worker(run, tiny_tokenizer, monkeypatch, [FINAL_ANSWER])
    row = dataset_rows(verl_config, verl_config.data.val_files, worker.tokenizer)[0]
    greedy = {**SAMPLING, "temperature": 0.0}

    await worker._run_prompt({**row, "uid": "v", "global_steps": 0}, greedy,
                             trajectory=await trajectory(0, row["index"], validate=True))

    assert len(server.calls) == 1  # val_kwargs.n = 1
    assert server.calls[0]["sampling_params"]["temperature"] == 0.0
    records = list(read_records(RolloutLog.for_run(run).path(0, "validation")))
    assert len(records) == 1 and records[0].reward == 1.0


def test_agent_loop_yaml_names_the_run(prepared_run):
    import yaml

    run = prepared_run()
    [entry] = yaml.safe_load((verl_dir(run) / "agent_loops.yaml").read_text())
    assert entry["_target_"] == "agenttune_verl.agent_loop.AgentTuneAgentLoop"
    assert entry["agenttune_config"] == str(run.run_dir.resolve() / "config.yaml")
    assert json.loads(json.dumps(entry))["source_dir"].endswith("tests/agents")
