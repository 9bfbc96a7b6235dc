"""Without a server: Tinker's losses equal agenttune's policy losses used for them, the protobuf
messages round-trip through the SDK's own converters, and pending futures answer 408 try_again."""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import pytest
import torch

from agenttune.entrypoints.tinker.futures import Futures, Result, TinkerError
from agenttune.entrypoints.tinker.losses import elementwise_loss
from agenttune.entrypoints.tinker.protobuf import (
    SampledSequence,
    read_forward_backward,
    write_forward_backward,
    write_sample,
)

tinker = pytest.importorskip("tinker")
types = tinker.types

T = 7


@pytest.fixture
def batch():
    generator = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(T, generator=generator) * 3).requires_grad_(True)
    sampled = logprobs.detach() + torch.randn(T, generator=generator) * 0.3  # ratios on both sides of the clip
    advantages = torch.randn(T, generator=generator)
    weights = torch.rand(T, generator=generator)
    return logprobs, {"logprobs": sampled, "advantages": advantages, "weights": weights}


def tinker_reference(loss_fn: str, logprobs, inputs, low=0.8, high=1.2):
    """Tinker's documented per-token losses, written out directly."""
    if loss_fn == "cross_entropy":
        return -inputs["weights"] * logprobs
    ratio = torch.exp(logprobs - inputs["logprobs"])
    advantages = inputs["advantages"]
    if loss_fn == "importance_sampling":
        return -ratio * advantages
    if loss_fn == "ppo":
        return -torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    return -torch.clamp(ratio, low, high).detach() * advantages * logprobs  # cispo


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo"])
@pytest.mark.parametrize("clip", [None, (0.9, 1.1)])
def test_tinker_losses_equal_agenttunes_policy_losses(batch, loss_fn, clip):
    logprobs, inputs = batch
    config = {} if clip is None else {"clip_low_threshold": clip[0], "clip_high_threshold": clip[1]}
    ours = elementwise_loss(loss_fn, logprobs, inputs, config)
    theirs = tinker_reference(loss_fn, logprobs, inputs, *(clip or (0.8, 1.2)))
    torch.testing.assert_close(ours, theirs)
    (ours_grad,) = torch.autograd.grad(ours.sum(), logprobs)
    (theirs_grad,) = torch.autograd.grad(theirs.sum(), logprobs)
    torch.testing.assert_close(ours_grad, theirs_grad)


def gspo_reference(logprobs, inputs, low=0.8, high=1.2):
    """Tinker's GSPO-token, as its documentation writes it: the sequence ratio over the masked tokens,
    every token carrying its value with its own log-prob's gradient, PPO's clipped objective per token."""
    in_ratio = inputs["sequence_ratio_mask"] != 0
    log_ratio = (logprobs.detach() - inputs["logprobs"])[in_ratio].mean()
    ratio = torch.exp(log_ratio + logprobs - logprobs.detach())
    clipped = torch.clamp(ratio, low, high)
    advantages = inputs["advantages"]
    return -torch.minimum(ratio * advantages, clipped * advantages)


@pytest.fixture
def sequence_batch(batch):
    """A datum as an RL loop sends it: a prompt (advantage 0, outside the ratio mask), then sampled tokens
    sharing one advantage, one token with another; the sampler's log-probs differ from the policy's."""
    logprobs, inputs = batch
    advantages = torch.tensor([0.0, 0.0, 0.7, 0.7, 0.7, -0.4, 0.7])
    ratio_mask = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    return logprobs, {**inputs, "advantages": advantages, "sequence_ratio_mask": ratio_mask}


@pytest.mark.parametrize("shift", [0.0, 0.15, -0.3])  # the sequence ratio inside, above and below the clip
@pytest.mark.parametrize("clip", [None, (0.9, 1.1)])
def test_tinkers_gspo_equals_agenttunes_gspo_loss(sequence_batch, shift, clip):
    logprobs, inputs = sequence_batch
    inputs = {**inputs, "logprobs": logprobs.detach() - shift + 0.01 * torch.arange(T)}
    config = {} if clip is None else {"clip_low_threshold": clip[0], "clip_high_threshold": clip[1]}
    ours = elementwise_loss("gspo", logprobs, inputs, config)
    theirs = gspo_reference(logprobs, inputs, *(clip or (0.8, 1.2)))
    torch.testing.assert_close(ours, theirs)
    (ours_grad,) = torch.autograd.grad(ours.sum(), logprobs)
    (theirs_grad,) = torch.autograd.grad(theirs.sum(), logprobs)
    torch.testing.assert_close(ours_grad, theirs_grad)


@pytest.mark.parametrize("beta", [0.05, 1.0])
def test_dro_is_tinkers_formula(batch, beta):
    logprobs, inputs = batch
    ours = elementwise_loss("dro", logprobs, inputs, {"beta": beta})
    theirs = -(logprobs * inputs["advantages"] - 0.5 * beta * (logprobs - inputs["logprobs"]) ** 2)
    torch.testing.assert_close(ours, theirs)
    (ours_grad,) = torch.autograd.grad(ours.sum(), logprobs)
    (theirs_grad,) = torch.autograd.grad(theirs.sum(), logprobs)
    torch.testing.assert_close(ours_grad, theirs_grad)


def test_an_unserved_loss_or_a_missing_input_is_a_users_error(batch):
    logprobs, inputs = batch
    for unserved in ("stable_reinforce", "custom"):
        with pytest.raises(TinkerError, match="not served yet"):
            elementwise_loss(unserved, logprobs, inputs, {})
    with pytest.raises(TinkerError, match="advantages"):
        elementwise_loss("ppo", logprobs, {"logprobs": inputs["logprobs"]}, {})
    with pytest.raises(TinkerError, match="sequence_ratio_mask"):
        elementwise_loss("gspo", logprobs, inputs, {})
    with pytest.raises(TinkerError, match="at least one token"):
        elementwise_loss("gspo", logprobs, {**inputs, "sequence_ratio_mask": torch.zeros(T)}, {})
    with pytest.raises(TinkerError, match="beta"):
        elementwise_loss("dro", logprobs, inputs, {})


def test_a_forward_backward_request_round_trips_through_the_sdks_converter():
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0.0, 1.0, -0.5]})
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="ppo",
                                                          loss_fn_config={"clip_low_threshold": 0.7}),
        model_id="session:train:0", seq_id=3)
    message = forward_backward_request_to_proto(request)
    message.forward_only = True
    read = read_forward_backward(message.SerializeToString(), None)
    assert (read.model_id, read.seq_id, read.loss_fn, read.forward_only) == ("session:train:0", 3, "ppo", True)
    assert read.config == {"clip_low_threshold": pytest.approx(0.7)}
    [ours] = read.data
    assert ours.tokens == [5, 6, 7]
    assert ours.inputs["target_tokens"].tolist() == [6, 7, 8]
    np.testing.assert_array_equal(ours.inputs["weights"], np.asarray([0.0, 1.0, -0.5], dtype=np.float32))


def test_a_zstd_compressed_request_is_read_and_an_unknown_encoding_refused():
    import zstandard
    from tinker.proto.request_conv import forward_backward_request_to_proto

    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3]})
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"), model_id="m", seq_id=1)
    body = forward_backward_request_to_proto(request).SerializeToString()
    assert read_forward_backward(zstandard.ZstdCompressor().compress(body), "zstd").data[0].tokens == [1, 2]
    with pytest.raises(TinkerError, match="Content-Encoding"):
        read_forward_backward(body, "br")
    with pytest.raises(TinkerError, match="not a ForwardBackwardRequest"):
        read_forward_backward(b"\xff\xff\xff", None)


def test_results_round_trip_through_the_sdks_deserializers():
    from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

    outputs = [{"logprobs": np.asarray([-1.0, -2.0], np.float32), "elementwise_loss": np.asarray([1, 2], np.float32)},
               {"logprobs": np.asarray([-0.5], np.float32), "elementwise_loss": np.asarray([0.5], np.float32)}]
    result = deserialize_forward_backward_output(write_forward_backward(outputs, {"loss:sum": 3.5}))
    assert result.metrics == {"loss:sum": 3.5}
    assert [out["logprobs"].data for out in result.loss_fn_outputs] == [[-1.0, -2.0], [-0.5]]
    assert result.loss_fn_outputs[1]["elementwise_loss"].shape == [1]

    sequences = [SampledSequence([4, 2], [-0.25, -1.5], True), SampledSequence([9], [-3.0], False)]
    sample = deserialize_sample_response(write_sample(sequences, [math.nan, -1.0, -2.0]))
    assert [(s.tokens, s.logprobs, s.stop_reason) for s in sample.sequences] == [
        ([4, 2], [-0.25, -1.5], "stop"), ([9], [-3.0], "length")]
    assert sample.prompt_logprobs == [None, -1.0, -2.0]


def test_a_pending_future_answers_none_until_its_work_is_done():
    release = threading.Event()

    async def scenario():
        futures = Futures(poll_s=0.05)
        request_id = futures.submit(lambda: (release.wait(5), Result(json={"done": True}))[1])
        assert await futures.wait(request_id) is None  # the route answers this with 408 try_again
        release.set()
        futures.poll_s = 5
        assert (await futures.wait(request_id)).json == {"done": True}
        assert (await futures.wait(request_id)).json == {"done": True}  # asked again: a broken connection
        failing = futures.submit(lambda: (_ for _ in ()).throw(TinkerError("no such thing.")))
        assert (await futures.wait(failing)).json == {"error": "no such thing.", "category": "user"}
        with pytest.raises(TinkerError):
            await futures.wait("unknown")
        futures.close()

    asyncio.run(scenario())


def test_removing_the_last_adapter_leaves_the_bare_base_model():
    from agenttune.components.engines.model_loading import resolve_model_path
    from agenttune.entrypoints.tinker.models import LoraSettings, ModelHost

    host = ModelHost("tiny://default", resolve_model_path("tiny://default"), device="cpu")
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        base = host.model(input_ids=ids).logits
        first = host.add_adapter(LoraSettings(rank=2, seed=0))
        second = host.add_adapter(LoraSettings(rank=2, seed=1, train_unembed=False))
        host.remove_adapter(first)
        with host.using(second) as model:  # B = 0: an untrained adapter changes nothing
            torch.testing.assert_close(model(input_ids=ids).logits, base)
        host.remove_adapter(second)
        assert host.peft is None
        with host.using(None) as model:
            torch.testing.assert_close(model(input_ids=ids).logits, base)


def test_checkpoint_names_cannot_leave_the_state_directory(tmp_path):
    from agenttune.entrypoints.tinker.checkpoints import CheckpointStore

    store = CheckpointStore(tmp_path)
    for model_id, name in [("..", "x"), ("run", ".."), ("run", "a/b"), ("run/../..", "x"), ("", "x")]:
        with pytest.raises(TinkerError):
            store.new(model_id, "weights", name)
    for path in ["file:///etc/passwd", "tinker://run/weights", "tinker://run/other/x", "tinker://../weights/x",
                 "tinker://run/weights/missing"]:
        with pytest.raises(TinkerError):
            store.find(path)
    checkpoint = store.new("s:train:0", "weights", "step-1")
    store.write_metadata(checkpoint, {"base_model": "m"})
    assert store.find("tinker://s:train:0/weights/step-1").directory == tmp_path / "s:train:0/weights/step-1"


def test_the_sampler_runs_one_set_of_weights_at_a_time_and_training_between():
    """Sample requests for the same weights decode together; a request for other weights waits for the
    engine to be idle and its adapter to be active; training queued while a group decodes runs after it,
    and requests arriving after that training do not join the group (they would starve it)."""
    import contextlib
    from types import SimpleNamespace

    from agenttune.components.engines.base import Generation
    from agenttune.entrypoints.tinker.sampling import Sampler, SamplingSession

    class Host:
        model = SimpleNamespace(config=SimpleNamespace(vocab_size=100))
        tokenizer = SimpleNamespace(eos_token_id=0)
        active, log = "nothing", []

        def context_length(self):
            return None

        @contextlib.contextmanager
        def using(self, name):
            self.active = name
            self.log.append(("on", name))
            yield
            self.log.append(("off", name))
            self.active = "nothing"

    class Engine:
        running = most = 0

        async def generate(self, prompt, sampling):
            self.running += 1
            self.most = max(self.most, self.running)
            adapter = host.active
            await asyncio.sleep(0.05)
            assert host.active == adapter  # nothing switched the weights while it decoded
            self.running -= 1
            return Generation([prompt[0]], [-1.0], "length", metadata={"adapter": adapter})

    host = Host()

    async def scenario():
        futures = Futures(poll_s=5)
        sampler = Sampler(host, None, futures)
        sampler.engine = Engine()
        sampler._adapter = lambda path: path  # the checkpoint's adapter is named as its path here
        base = sampler.open(None).session_id
        sampler.sessions["ckpt"] = SamplingSession("ckpt", "ckpt")

        def sample(session):
            return asyncio.create_task(sampler.sample(session, [1 if session == base else 2], 2, {"seed": 1},
                                                      prompt_logprobs=False))

        first = [sample(base), sample(base), sample("ckpt")]
        await asyncio.sleep(0)  # they are admitted: the base model's group holds the worker
        training = futures.submit(lambda: (host.log.append(("train", host.active)), Result(json={}))[1])
        late = sample(base)
        results = await asyncio.gather(*first, late)
        assert (await futures.wait(training)).json == {}
        futures.close()
        most[0] = sampler.engine.most
        return results

    most = [0]
    results = asyncio.run(scenario())
    assert host.log == [("on", None), ("off", None), ("train", "nothing"), ("on", "ckpt"), ("off", "ckpt"),
                        ("on", None), ("off", None)]
    assert [[s.tokens for s in result.sequences] for result in results] == [[[1], [1]]] * 2 + [[[2], [2]]] + \
        [[[1], [1]]]
    assert most[0] == 4  # the first two requests' sequences decoded together
