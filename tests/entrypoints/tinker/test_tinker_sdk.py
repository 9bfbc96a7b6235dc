"""The real `tinker` SDK (0.38) against `agenttune tinker serve`'s app on the tiny model, on CPU:
handshake, LoRA training clients, forward_backward and optim_step, sampling, checkpoints, refusals."""

from __future__ import annotations

import warnings

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
types = tinker.types

MODEL = "tiny://default"
API_KEY = "tml-agenttune-tests"  # conftest.py sets it as TINKER_API_KEY

TEXT = "The quick brown fox jumps over the lazy dog, again and again."


def datum(tokenizer, text: str = TEXT, weights: float = 1.0):
    ids = tokenizer.encode(text)
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [weights] * (len(ids) - 1)})


def logprobs_of(training_client, data) -> list[np.ndarray]:
    """The target tokens' log-probs under the client's current weights (a forward pass, no gradient)."""
    out = training_client.forward(data, "cross_entropy").result()
    return [np.asarray(output["logprobs"].data) for output in out.loss_fn_outputs]


@pytest.fixture(scope="module")
def training_client(service):
    return service.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()


def test_handshake_capabilities_and_get_info(service, training_client, server):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (deprecated in the SDK in favour of RestClient)
        capabilities = service.get_server_capabilities()
    [model] = capabilities.supported_models
    assert (model.model_name, model.trainable, model.sampleable) == (MODEL, True, True)
    info = training_client.get_info()
    assert info.model_id.endswith(":train:0") and info.is_lora and info.lora_rank == 4
    assert info.model_data.model_name == MODEL and info.model_data.arch == "qwen2"
    # tokenizer_id is the model's directory: the SDK's get_tokenizer loads it on this machine
    assert training_client.get_tokenizer().encode(TEXT) == server[1].host.tokenizer.encode(TEXT)


def test_cross_entropy_goes_down_over_steps_on_a_fixed_batch(service, tokenizer):
    client = service.create_lora_training_client(base_model=MODEL, rank=8, seed=1).result()
    batch = [datum(tokenizer), datum(tokenizer, "Hello world, this is agenttune speaking.")]
    losses = []
    for _ in range(5):
        forward_backward = client.forward_backward(batch, "cross_entropy")
        step = client.optim_step(types.AdamParams(learning_rate=1e-2))
        result = forward_backward.result()
        assert step.result().metrics["step"] >= 1
        # the loss is Tinker's: a sum over tokens of -weight * log p, consistent with the log-probs returned
        expected = sum(-(np.asarray(out["logprobs"].data) * d.loss_fn_inputs["weights"].data).sum()
                       for out, d in zip(result.loss_fn_outputs, batch, strict=True))
        assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
        losses.append(result.metrics["loss:sum"])
    assert losses[-1] < 0.7 * losses[0], losses


def test_forward_backward_custom_trains_through_signed_weights(service, tokenizer):
    client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=2).result()
    batch = [datum(tokenizer)]

    def mean_nll(data, logprobs_list):
        loss = torch.stack([-lp.mean() for lp in logprobs_list]).sum()
        return loss, {"custom:mean_nll": float(loss.detach())}

    before = logprobs_of(client, batch)[0]
    result = client.forward_backward_custom(batch, mean_nll).result()
    assert result.metrics["loss:sum"] == pytest.approx(-before.mean(), rel=1e-4)
    assert result.metrics["custom:mean_nll"] == pytest.approx(-before.mean(), rel=1e-4)
    client.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    assert logprobs_of(client, batch)[0].mean() > before.mean()


def test_sampling_from_saved_weights_has_the_trainers_logprobs(service, training_client, tokenizer):
    training_client.forward_backward([datum(tokenizer)], "cross_entropy").result()
    training_client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    saved = training_client.save_weights_for_sampler("sampler-1").result()
    assert saved.path.startswith("tinker://") and saved.path.endswith("/sampler_weights/sampler-1")
    sampler = service.create_sampling_client(model_path=saved.path).result()
    prompt = tokenizer.encode("The quick brown")
    response = sampler.sample(types.ModelInput.from_ints(prompt), 2,
                              types.SamplingParams(max_tokens=6, seed=3, stop=[]),
                              include_prompt_logprobs=True).result()
    assert len(response.sequences) == 2
    for sequence in response.sequences:
        assert len(sequence.tokens) == 6 and len(sequence.logprobs) == 6 and sequence.stop_reason == "length"
        # the sampler's log-probs are the training client's for the same tokens (same weights)
        ids = prompt + sequence.tokens
        check = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
        trained = logprobs_of(training_client, [check])[0][len(prompt) - 1:]
        np.testing.assert_allclose(sequence.logprobs, trained, atol=2e-4)
    assert response.prompt_logprobs[0] is None and len(response.prompt_logprobs) == len(prompt)
    assert all(value < 0 for value in response.prompt_logprobs[1:])
    # the same seed draws the same tokens
    again = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6, seed=3, stop=[]))
    assert [s.tokens for s in again.result().sequences] == [s.tokens for s in response.sequences]


def test_base_model_sampling_and_compute_logprobs(service, tokenizer):
    sampler = service.create_sampling_client(base_model=MODEL).result()
    prompt = tokenizer.encode("Hello world")
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    assert scored[0] is None and len(scored) == len(prompt)
    sampled = sampler.sample(types.ModelInput.from_ints(prompt), 1,
                             types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])).result()
    assert sampled.prompt_logprobs is None and len(sampled.sequences[0].tokens) == 4


def test_live_adapter_sampling_client(training_client, tokenizer):
    sampler = training_client.save_weights_and_get_sampling_client().result()
    response = sampler.sample(types.ModelInput.from_ints(tokenizer.encode("Once upon")), 1,
                              types.SamplingParams(max_tokens=3, stop=[])).result()
    assert len(response.sequences[0].tokens) == 3


def test_sampler_checkpoints_beyond_the_loaded_few_are_reloaded(service, server, tokenizer):
    from agenttune.entrypoints.tinker.sampling import LOADED_CHECKPOINTS

    client = service.create_lora_training_client(base_model=MODEL, rank=2, seed=7).result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("Once"))
    paths, first = [], None
    for index in range(LOADED_CHECKPOINTS + 1):
        client.forward_backward([datum(tokenizer)], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        paths.append(client.save_weights_for_sampler(f"many-{index}").result().path)
        scored = service.create_sampling_client(model_path=paths[-1]).result().compute_logprobs(prompt).result()
        first = scored if first is None else first
    loaded = [name for name in server[1].host.peft.peft_config if name.startswith("sampler")]
    assert len(loaded) <= LOADED_CHECKPOINTS
    again = service.create_sampling_client(model_path=paths[0]).result().compute_logprobs(prompt).result()
    assert again == first
    # saved again under the same name, a checkpoint is sampled with its new weights
    client.save_weights_for_sampler("many-0").result()
    renewed = service.create_sampling_client(model_path=paths[0]).result().compute_logprobs(prompt).result()
    assert renewed == scored and renewed != first


def test_only_the_newest_snapshots_are_kept_on_disk(service, server, tokenizer):
    from agenttune.entrypoints.tinker.app import SNAPSHOTS_KEPT

    client = service.create_lora_training_client(base_model=MODEL, rank=2, seed=8).result()
    for _ in range(SNAPSHOTS_KEPT + 2):
        client.save_weights_and_get_sampling_client().result()
    snapshots = list(server[1].store.root.glob(f"{client.model_id}/sampler_weights/snapshot-*"))
    assert len(snapshots) == SNAPSHOTS_KEPT


def test_delete_checkpoint_by_id_and_by_bare_name(service, server):
    """The SDK's `delete_checkpoint` (`<kind>/<name>`), and the bare name Trinity-RFT's Tinker trainer sends
    for its stale sampler checkpoint; a name both kinds hold must say which, an unknown one is a 404."""
    rest = tinker.RestClient(base_url=server[0])
    store = server[1].store
    client = service.create_lora_training_client(base_model=MODEL, rank=2, seed=9).result()
    by_id = client.save_weights_for_sampler("to-delete").result().path
    bare = client.save_weights_for_sampler("stale-sampler-1").result().path
    both = [client.save_state("twin").result().path, client.save_weights_for_sampler("twin").result().path]
    rest.delete_checkpoint(client.model_id, "sampler_weights/to-delete").result()
    rest.delete_checkpoint(client.model_id, "stale-sampler-1").result()
    for path in (by_id, bare):
        with pytest.raises(Exception, match="No checkpoint is saved"):
            store.find(path)
    with pytest.raises(Exception, match="name the one to delete with its kind"):
        rest.delete_checkpoint(client.model_id, "twin").result()
    with pytest.raises(Exception, match="No checkpoint 'never-saved'"):
        rest.delete_checkpoint(client.model_id, "never-saved").result()
    assert all(store.find(path) for path in both)  # neither twin was touched


def test_finishing_a_session_unloads_its_training_clients(server):
    base_url, state = server
    service = tinker.ServiceClient(base_url=base_url, api_key=API_KEY)
    clients = [service.create_lora_training_client(base_model=MODEL, rank=2).result() for _ in range(2)]
    assert all(client.model_id in state.trainer.runs for client in clients)
    service.close("success").result()
    with tinker.ServiceClient(base_url=base_url, api_key=API_KEY) as service_after:  # queued behind the unload
        service_after.create_lora_training_client(base_model=MODEL, rank=2).result()
    assert not any(client.model_id in state.trainer.runs for client in clients)


def test_save_state_and_load_state_restore_the_weights(service, server, tokenizer):
    client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=4).result()
    batch = [datum(tokenizer)]
    client.forward_backward(batch, "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    saved = client.save_state("state-1").result()
    assert saved.path.endswith("/weights/state-1")
    at_save = logprobs_of(client, batch)[0]
    client.forward_backward(batch, "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert not np.allclose(logprobs_of(client, batch)[0], at_save)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # load_state is deprecated in the SDK, still sent
        client.load_state(saved.path).result()
    np.testing.assert_array_equal(logprobs_of(client, batch)[0], at_save)
    _, state = server  # the adapter's tensors are the saved ones, exactly
    from safetensors.torch import load_file
    saved_tensors = load_file(str(state.store.find(saved.path).directory / "adapter_model.safetensors"))
    loaded = state.host.weights(state.trainer.run(client.model_id).adapter)
    assert saved_tensors.keys() == loaded.keys() and len(loaded) > 0
    assert all(torch.equal(saved_tensors[key], loaded[key]) for key in loaded)
    resumed = service.create_training_client_from_state_with_optimizer(saved.path).result()
    np.testing.assert_array_equal(logprobs_of(resumed, batch)[0], at_save)
    info = tinker.RestClient(base_url=server[0]).get_weights_info_by_tinker_path(saved.path).result()
    assert (info.base_model, info.lora_rank, info.is_lora) == (MODEL, 4, True)


def test_checkpoints_survive_a_restart(tmp_path, tokenizer, start_server):
    batch = [datum(tokenizer)]
    with start_server(tmp_path) as (base_url, _):
        service = tinker.ServiceClient(base_url=base_url, api_key=API_KEY)
        client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=5).result()
        client.forward_backward(batch, "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        state_path = client.save_state("before-restart").result().path
        sampler_path = client.save_weights_for_sampler("before-restart").result().path
        before = logprobs_of(client, batch)[0]
        service.close("success").result()
    with start_server(tmp_path) as (base_url, _), tinker.ServiceClient(base_url=base_url, api_key=API_KEY) as service:
        resumed = service.create_training_client_from_state(state_path).result()
        np.testing.assert_array_equal(logprobs_of(resumed, batch)[0], before)
        sampler = service.create_sampling_client(model_path=sampler_path).result()
        prompt = tokenizer.encode(TEXT)
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
        np.testing.assert_allclose(scored[1:], before, atol=2e-4)


def test_training_runs_and_checkpoints_are_listed_also_after_a_restart(tmp_path, start_server):
    """The SDK's RestClient listings: a live client, then (after a restart) the runs known by their checkpoints."""
    with start_server(tmp_path) as (base_url, _):
        service = tinker.ServiceClient(base_url=base_url, api_key=API_KEY)
        client = service.create_lora_training_client(base_model=MODEL, rank=3, seed=6).result()
        rest = tinker.RestClient(base_url=base_url, api_key=API_KEY)
        live = rest.get_training_run(client.model_id).result()
        assert (live.training_run_id, live.base_model, live.lora_rank, live.last_checkpoint) == \
            (client.model_id, MODEL, 3, None)
        state_path = client.save_state("first").result().path
        sampler_path = client.save_weights_for_sampler("first").result().path
        service.close("success").result()
    with start_server(tmp_path) as (base_url, _):
        rest = tinker.RestClient(base_url=base_url, api_key=API_KEY)
        run = rest.get_training_run_by_tinker_path(sampler_path).result()
        assert run.training_run_id == client.model_id and run.lora_rank == 3
        assert (run.last_checkpoint.tinker_path, run.last_sampler_checkpoint.tinker_path) == (state_path, sampler_path)
        listed = rest.list_checkpoints(client.model_id).result().checkpoints
        assert {(c.checkpoint_type, c.tinker_path) for c in listed} == {("training", state_path), ("sampler", sampler_path)}
        assert all(c.size_bytes > 0 for c in listed)
        runs = rest.list_training_runs().result()
        assert [r.training_run_id for r in runs.training_runs] == [client.model_id] and runs.cursor.total_count == 1
        page = rest.list_user_checkpoints(limit=1, offset=1).result()
        assert len(page.checkpoints) == 1 and page.cursor.total_count == 2
        assert page.checkpoints[0].tinker_path == state_path  # newest first: the sampler weights were saved last
        rest.delete_checkpoint(client.model_id, "weights/first").result()
        assert [c.tinker_path for c in rest.list_checkpoints(client.model_id).result().checkpoints] == [sampler_path]
        with pytest.raises(Exception, match="No training run 'never-made'"):
            rest.get_training_run("never-made").result()
        with pytest.raises(Exception, match="cannot name a checkpoint"):
            rest.list_checkpoints("run*").result()  # a glob pattern is not an id
        reply = httpx.get(base_url + "/api/v1/checkpoints", headers={"X-API-Key": API_KEY}, params={"limit": "x"})
        assert reply.status_code == 400 and reply.json()["error"] == "limit and offset must be whole numbers."


def test_the_sdk_polls_through_408_try_again(tmp_path, tokenizer, start_server):
    with (start_server(tmp_path, poll_s=0.0005) as (base_url, _),  # pending requests answer 408 at once
          tinker.ServiceClient(base_url=base_url, api_key=API_KEY) as service):
        client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=6).result()
        result = client.forward_backward([datum(tokenizer)], "cross_entropy").result()
        assert result.metrics["loss:sum"] > 0
        reply = httpx.post(base_url + "/api/v1/retrieve_future", headers={"X-API-Key": API_KEY},
                           json={"request_id": _slow_request(base_url, client.model_id)})
        assert reply.status_code == 408 and reply.json()["type"] == "try_again"


def _slow_request(base_url: str, model_id: str) -> str:
    """A forward_backward sent by hand, large enough to be pending when its result is asked for."""
    from tinker.proto.request_conv import forward_backward_request_to_proto

    data = [types.Datum(model_input=types.ModelInput.from_ints([7] * 512),
                        loss_fn_inputs={"target_tokens": [7] * 512, "weights": [1.0] * 512})] * 8
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
        model_id=model_id, seq_id=2)
    reply = httpx.post(base_url + "/api/v1/forward_backward", content=forward_backward_request_to_proto(request)
                       .SerializeToString(), headers={"X-API-Key": API_KEY, "Content-Type": "application/x-protobuf"})
    assert reply.status_code == 200, reply.text
    return reply.json()["request_id"]


def test_an_unserved_loss_fails_the_request_with_a_sentence(training_client, tokenizer):
    with pytest.raises(tinker.RequestFailedError, match="not served yet"):
        training_client.forward(
            [types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                         loss_fn_inputs={"target_tokens": [2, 3], "logprobs": [-1.0, -1.0],
                                         "advantages": [1.0, 1.0]})], "stable_reinforce").result()


def test_gspo_and_dro_through_the_sdk_give_tinkers_per_token_losses(training_client, tokenizer):
    """The inputs and the config cross the wire: the per-token losses the server answers are Tinker's
    formulas on the log-probs it answers (test_tinker_wire.py checks values and gradients in-process)."""
    [plain] = [datum(tokenizer)]
    count = len(plain.loss_fn_inputs["target_tokens"].data)
    sampled = (logprobs_of(training_client, [plain])[0] + 0.05 * np.arange(count)).tolist()
    advantages = [0.0] * 3 + [0.5] * (count - 4) + [-1.0]
    ratio_mask = [0.0] * 3 + [1.0] * (count - 3)
    inputs = {"target_tokens": plain.loss_fn_inputs["target_tokens"], "logprobs": sampled, "advantages": advantages}
    gspo = training_client.forward([types.Datum(model_input=plain.model_input, loss_fn_inputs={
        **inputs, "sequence_ratio_mask": ratio_mask})], "gspo", {"clip_low_threshold": 0.9}).result()
    dro = training_client.forward([types.Datum(model_input=plain.model_input, loss_fn_inputs=inputs)], "dro",
                                  {"beta": 0.5}).result()
    for out, loss_fn in ((gspo, "gspo"), (dro, "dro")):
        [output] = out.loss_fn_outputs
        logprobs = torch.tensor(output["logprobs"].data)
        old, adv = torch.tensor(sampled), torch.tensor(advantages)
        if loss_fn == "gspo":
            ratio = torch.exp((logprobs - old)[torch.tensor(ratio_mask) != 0].mean())
            expected = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.9, 1.2) * adv)
        else:
            expected = -(logprobs * adv - 0.25 * (logprobs - old) ** 2)
        torch.testing.assert_close(torch.tensor(output["elementwise_loss"].data), expected, atol=1e-5, rtol=1e-4)
        assert out.metrics["loss:sum"] == pytest.approx(float(expected.sum()), abs=1e-4)


def test_unknown_and_unserved_routes_answer_the_error_shape(server):
    base_url, _ = server
    headers = {"X-API-Key": API_KEY}
    for method, path, status in [("POST", "/api/v1/no_such_route", 404), ("GET", "/api/v1/sessions", 404),
                                 ("GET", "/api/v1/create_model", 405), ("GET", "/", 404)]:
        reply = httpx.request(method, base_url + path, headers=headers, json=None)
        assert reply.status_code == status, (path, reply.text)
        body = reply.json()
        assert body["category"] == "user" and body["error"].endswith(".") and body["error"].count(". ") == 0
    reply = httpx.post(base_url + "/api/v1/create_model", headers=headers, json={"base_model": MODEL})
    assert reply.status_code == 400 and "CreateModelRequest" in reply.json()["error"]
    reply = httpx.post(base_url + "/api/v1/retrieve_future", headers=headers, json={"request_id": "nope"})
    assert reply.status_code == 404
    reply = httpx.post(base_url + "/api/v1/create_session", headers=headers, content=b"tags=x",
                       params=None, timeout=10)
    assert reply.status_code == 415


def test_a_bad_api_key_is_refused(server, tmp_path, start_server):
    base_url, _ = server
    for key in ("", "sk-not-tinker"):
        reply = httpx.get(base_url + "/api/v1/get_server_capabilities", headers={"X-API-Key": key})
        assert reply.status_code == 401 and "tml-" in reply.json()["error"]
    with start_server(tmp_path, api_key="tml-the-one-key") as (url, _):
        reply = httpx.get(url + "/api/v1/healthz", headers={"X-API-Key": API_KEY})
        assert reply.status_code == 401
        with (tinker.ServiceClient(base_url=url, api_key="tml-another-key") as stranger,
              pytest.raises(tinker.AuthenticationError, match="not this server's")):
            stranger.create_lora_training_client(base_model=MODEL, rank=4).result()
        assert httpx.get(url + "/api/v1/healthz", headers={"X-API-Key": "tml-the-one-key"}).json() == {"status": "ok"}


def test_a_foreign_host_header_is_refused(tmp_path, start_server):
    with start_server(tmp_path, allowed_hosts=frozenset({"127.0.0.1", "localhost"})) as (url, _):
        reply = httpx.get(url + "/api/v1/healthz", headers={"X-API-Key": API_KEY, "Host": "evil.example"})
        assert reply.status_code == 421


@pytest.mark.slow
def test_an_rl_loop_learns_through_the_server(service, tokenizer):
    """Sample, reward (the share of even token ids), ppo on the sampler's log-probs, step: the reward rises."""
    client = service.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()
    prompt = tokenizer.encode("Count:")
    rewards = []
    for step in range(8):
        sampler = client.save_weights_and_get_sampling_client().result()
        sampled = sampler.sample(types.ModelInput.from_ints(prompt), 16,
                                 types.SamplingParams(max_tokens=8, stop=[], seed=step)).result().sequences
        reward = np.asarray([np.mean([token % 2 == 0 for token in s.tokens]) for s in sampled])
        rewards.append(reward.mean())
        data = []
        for sequence, advantage in zip(sampled, reward - reward.mean(), strict=True):
            ids, context = prompt + sequence.tokens, len(prompt) - 1
            data.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
                "target_tokens": ids[1:], "logprobs": [0.0] * context + list(sequence.logprobs),
                "advantages": [0.0] * context + [float(advantage)] * len(sequence.tokens)}))
        result = client.forward_backward(data, "ppo").result()
        # one update per batch: every ratio is 1, so the loss is -sum(A) = 0 (the sampler's log-probs are the trainer's)
        assert abs(result.metrics["loss:sum"]) < 1e-3
        client.optim_step(types.AdamParams(learning_rate=3e-2)).result()
    assert np.mean(rewards[-3:]) >= rewards[0] + 0.3, rewards


def test_concurrent_samples_share_the_engines_batch_and_each_checkpoint_keeps_its_weights(service, server,
                                                                                          tokenizer):
    """Sample requests in flight together decode in one engine batch when they name the same weights;
    requests for two checkpoints, interleaved, each get their own weights' log-probs (the trainer's)."""
    clients, samplers = [], []
    for index, text in enumerate(["one two three four five six", "the lazy dog sleeps by the fire"]):
        client = service.create_lora_training_client(base_model=MODEL, rank=4, seed=20 + index).result()
        for _ in range(3):
            client.forward_backward([datum(tokenizer, text)], "cross_entropy").result()
            client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        clients.append(client)
        path = client.save_weights_for_sampler(f"concurrent-{index}").result().path
        samplers.append(service.create_sampling_client(model_path=path).result())
    prompt = tokenizer.encode("The quick brown")
    engine = server[1].sampler.engine
    steps_before = len(engine.decode_steps) if engine is not None else 0

    # the same weights: 6 requests of 2 sequences, all sent before any result is awaited
    futures = [samplers[0].sample(types.ModelInput.from_ints(prompt), 2,
                                  types.SamplingParams(max_tokens=16, seed=seed, stop=[])) for seed in range(6)]
    replies = [future.result() for future in futures]
    engine = server[1].sampler.engine
    rows = [rows for rows, _ in list(engine.decode_steps)[steps_before:]]
    assert max(rows) > 2, rows  # more than one request's sequences in one decode step
    assert sum(len(s.tokens) for reply in replies for s in reply.sequences) == 6 * 2 * 16

    # two checkpoints, interleaved (and one request at another temperature): each its own weights
    futures = [(index, samplers[index].sample(types.ModelInput.from_ints(prompt), 2,
                                              types.SamplingParams(max_tokens=6, seed=request, stop=[],
                                                                   temperature=0.7 if request == 2 else 1.0)))
               for request in range(4) for index in (0, 1)]
    for index, future in futures:
        for sequence in future.result().sequences:
            ids = prompt + sequence.tokens
            check = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
            own, other = (logprobs_of(client, [check])[0][len(prompt) - 1:] for client in
                          (clients[index], clients[1 - index]))
            np.testing.assert_allclose(sequence.logprobs, own, atol=2e-4)
            assert np.abs(own - other).max() > 1e-2  # (the two checkpoints do differ)


def test_record_batches_keeps_every_datum_trained_on_and_nothing_else(service, training_client, tokenizer, server,
                                                                     tmp_path):
    """`--record-batches`: one JSON line per forward_backward, with the datums' ids and loss inputs as sent;
    a forward pass (no training) is not recorded."""
    import json

    trainer = server[1].trainer
    trainer.batch_record = tmp_path / "batches.jsonl"
    try:
        batch = [datum(tokenizer), datum(tokenizer, "Hello world, this is agenttune speaking.", weights=0.5)]
        training_client.forward_backward(batch, "cross_entropy").result()
        training_client.forward(batch, "cross_entropy").result()
    finally:
        trainer.batch_record = None
    [line] = [json.loads(text) for text in (tmp_path / "batches.jsonl").read_text(encoding="utf-8").splitlines()]
    assert (line["model_id"], line["loss_fn"]) == (training_client.get_info().model_id, "cross_entropy")
    assert [row["tokens"] for row in line["datums"]] == [d.model_input.to_ints() for d in batch]
    assert [row["target_tokens"] for row in line["datums"]] == [d.loss_fn_inputs["target_tokens"].data for d in batch]
    assert [set(row["weights"]) for row in line["datums"]] == [{1.0}, {0.5}]
