"""Trinity-RFT 0.6.0's Tinker mode against agenttune's Tinker-compatible server, on CPU, without Ray.

What runs for real: `agenttune tinker serve` (the CLI, in its own process, on the tiny model's directory);
the `tinker` 0.38.0 SDK; Trinity's own config validator (`_check_tinker` asks the server's capabilities),
its rollout model `TinkerModel` behind its `ModelWrapper`, its GRPO advantage function and its
`TinkerTrainerWrapper` (`forward_backward_custom` with Trinity's PPO loss, `optim_step`, `save_state`,
`save_weights_for_sampler`, resume with `create_training_client_from_state_with_optimizer`), and the
weight sync Trinity does in this mode (the trainer's sampler path through the Synchronizer to the
explorer's `TinkerModel.sync_model_weights`). What stands in for Ray: `LocalActor`, which calls the
object's methods where Ray would call its actor's, and a synchronizer that keeps the (path, version) pair
the real one keeps.
"""

from __future__ import annotations

import asyncio
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_translation import loaded

tinker = pytest.importorskip("tinker")

API_KEY = "tml-trinity-tinker-mode"


def _base_url(process: subprocess.Popen, log: Path, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"Tinker base URL: (http://\S+)", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise AssertionError(f"`agenttune tinker serve` exited with {process.returncode}: {log.read_text()}")
        time.sleep(0.2)
    raise AssertionError("`agenttune tinker serve` printed no base URL")


@pytest.fixture(scope="module")
def tinker_server(tmp_path_factory):
    """The real CLI on a free loopback port, serving the tiny model's directory (Trinity's model_path)."""
    from agenttune.testing import tiny_model_path

    state_dir = tmp_path_factory.mktemp("tinker-state")
    command = [sys.executable, "-m", "agenttune", "tinker", "serve", "--model", str(tiny_model_path()),
               "--port", "0", "--state-dir", str(state_dir), "--api-key", API_KEY]
    log = state_dir / "server.log"  # a file, not a pipe: a full pipe would stall the server
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=stderr, stderr=stderr, text=True)
    try:
        yield _base_url(process, log)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def tinker_env(tinker_server, monkeypatch):
    """What Trinity's launcher puts in its actors' environment in Tinker mode (`Config.get_envs`)."""
    monkeypatch.setenv("TINKER_BASE_URL", tinker_server)
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    return tinker_server


class LocalActor:
    """Where Ray would put an actor handle: `handle.method.remote(...)` runs `method` and is awaitable."""

    def __init__(self, target) -> None:
        self._target = target

    def __getattr__(self, name: str):
        method = getattr(self._target, name)

        def remote(*args, **kwargs):
            result = method(*args, **kwargs)
            if asyncio.iscoroutine(result):
                return asyncio.ensure_future(result)
            future = asyncio.get_running_loop().create_future()
            future.set_result(result)
            return future

        return SimpleNamespace(remote=remote)


class Synchronizer:
    """The two calls Trinity's Tinker trainer and rollout model make on the Synchronizer actor, with the
    state the real one (`trinity.manager.synchronizer.Synchronizer`) keeps for them."""

    def __init__(self) -> None:
        self.model_state_dict, self.model_version = None, 0

    def set_model_state_dict(self, model_state_dict, trainer_step: int) -> None:
        self.model_state_dict, self.model_version = model_state_dict, trainer_step

    def get_model_state_dict(self):
        return self.model_state_dict, self.model_version


@pytest.fixture
def no_ray(monkeypatch):
    """Trinity's Tinker modules without a Ray cluster: the synchronizer actor is a `LocalActor`."""
    from trinity.common.models import tinker_model
    from trinity.manager.synchronizer import Synchronizer as TrinitySynchronizer
    from trinity.trainer.tinker import tinker_trainer

    synchronizer = LocalActor(Synchronizer())
    monkeypatch.setattr(TrinitySynchronizer, "get_actor", classmethod(lambda cls, *a, **k: synchronizer))
    monkeypatch.setattr(tinker_model, "ray", SimpleNamespace(
        get_runtime_context=lambda: SimpleNamespace(namespace="agenttune-test")))
    # `ray.get(synchronizer.set_model_state_dict.remote(...))` in upload_state_dict: a done future here
    monkeypatch.setattr(tinker_trainer, "ray", SimpleNamespace(get=lambda future: future.result()))
    return synchronizer._target


@pytest.fixture
def tinker_cfg(make_config, tmp_path: Path, tinker_env):
    """agenttune's generated Trinity config with Tinker mode on, through Trinity's own validators."""
    from agenttune_trinity.launch import check_and_update
    from trinity.common.constants import SyncMethod

    # a learning rate at which one step visibly moves the tiny model's log-probs
    cfg = loaded(make_config(trainer={"n_gpus_per_node": 4, "learning_rate": 1e-3}), tmp_path)
    cfg.model.tinker.enable = True
    cfg.model.tinker.base_url = tinker_env
    cfg.model.tinker.rank, cfg.model.tinker.seed = 4, 0
    check_and_update(cfg)  # `_check_tinker`: the model_path must be among the server's supported models
    assert (cfg.explorer.rollout_model.engine_type, cfg.trainer.trainer_type) == ("tinker", "tinker")
    assert cfg.synchronizer.sync_method == SyncMethod.CHECKPOINT
    assert cfg.get_envs()["TINKER_BASE_URL"] == tinker_env
    assert cfg.algorithm.optimizer.lr == 1e-3
    return cfg


def test_the_config_check_refuses_a_model_the_server_does_not_serve(make_config, tmp_path: Path, tinker_env):
    from agenttune_trinity.launch import check_and_update

    from agenttune.plugin_api import UserError

    cfg = loaded(make_config(), tmp_path)
    cfg.model.tinker.enable = True
    cfg.model.tinker.base_url = tinker_env
    cfg.model.model_path = str(tmp_path / "another-model")
    with pytest.raises(UserError, match="is not supported by tinker"):
        check_and_update(cfg)


async def rollout_model(cfg):
    """What Trinity's allocator builds for engine_type tinker: a `TinkerModel` actor, prepared, behind a
    `ModelWrapper` (`allocator.get_model_wrapper`)."""
    from trinity.common.models.model import ModelWrapper
    from trinity.common.models.tinker_model import TinkerModel

    actor = LocalActor(TinkerModel(config=cfg.explorer.rollout_model))
    await actor.prepare.remote()  # ServiceClient() from the environment; a sampling client on the base model
    wrapper = ModelWrapper(models=[actor], config=cfg.explorer.rollout_model,
                           api_address=await actor.get_api_server_url.remote())
    await wrapper.prepare()
    return wrapper


async def test_trinity_explores_trains_syncs_and_resumes_through_the_server(tinker_cfg, no_ray, tiny_tokenizer):
    from trinity.algorithm import ADVANTAGE_FN
    from trinity.common.constants import SyncMethod
    from trinity.trainer.tinker.tinker_trainer import TinkerTrainerWrapper

    cfg = tinker_cfg
    model = await rollout_model(cfg)

    # -- explore: Trinity's chat path (TinkerModel.chat -> SamplingClient.sample_async) -------------------
    messages = [{"role": "user", "content": "What is 40 + 2?"}]
    experiences = await model.chat_async([dict(m) for m in messages], n=4, max_tokens=12, temperature=1.0, seed=7)
    assert len(experiences) == 4
    for experience in experiences:
        response = len(experience.tokens) - experience.prompt_length
        assert 1 <= response <= 12
        assert experience.logprobs.shape == (response,)
        assert experience.action_mask.shape == (response,) and bool(experience.action_mask.all())
        assert all(math.isfinite(value) and value <= 0 for value in experience.logprobs.tolist())
        assert experience.response_text == tiny_tokenizer.decode(experience.tokens[experience.prompt_length:])
    # the OpenAI-style client Trinity hands workflows in Tinker mode goes through the same chat call
    client = model.get_openai_async_client()
    completion = await client.chat.completions.create(messages=[dict(m) for m in messages], n=2, max_tokens=6)
    assert len(completion.choices) == 2
    assert all(len(choice.logprobs.content) >= 1 for choice in completion.choices)

    # the rollout's log-probs are the model's own: compute_logprobs over the same tokens gives them again
    sampled = experiences[0]
    scored = await model.logprobs_async(sampled.tokens.tolist())
    assert scored.shape == (len(sampled.tokens) - 1,)
    assert scored[sampled.prompt_length - 1:].tolist() == pytest.approx(sampled.logprobs.tolist(), abs=1e-4)
    fixed = sampled.tokens.tolist()
    before = scored

    # -- the explorer's advantages (Trinity's GRPO), then the trainer's step -----------------------------
    for index, experience in enumerate(experiences):
        experience.reward = float(index % 2)  # a group with signal
    advantage_fn = ADVANTAGE_FN.get(cfg.algorithm.advantage_fn)(**cfg.algorithm.advantage_fn_args)
    experiences, _ = advantage_fn(experiences)
    assert all(experience.advantages is not None for experience in experiences)

    trainer = TinkerTrainerWrapper(cfg)
    await trainer.prepare()  # create_rest_client, create_lora_training_client, get_info, a base-model sampler
    assert trainer.train_step_num == 0 and trainer.model_info.model_data.model_name == cfg.model.model_path
    assert trainer.algorithm.use_reference  # GRPO: the train step asks the base model for ref log-probs
    metrics = await trainer.train_step(experiences)  # compute_logprobs (ref), forward_backward_custom, optim_step
    assert trainer.train_step_num == 1
    assert math.isfinite(metrics["actor/final_loss"]) and math.isfinite(metrics["actor/pg_loss"])
    assert math.isfinite(metrics["loss:sum"]) and metrics["grad_norm"] > 0  # the server's own metrics
    # the trainer's log-probs of the sampled tokens are the sampler's: Trinity's PPO ratio starts at 1
    assert abs(metrics["actor/ppo_kl"]) < 1e-4 and metrics["actor/pg_clipfrac"] == 0
    assert metrics["response_length/max"] <= 12

    # -- weight sync: save_weights_for_sampler -> Synchronizer -> TinkerModel.sync_model_weights ---------
    await trainer.upload_state_dict()
    sampler_path, version = no_ray.get_model_state_dict()
    assert version == 1 and re.fullmatch(r"tinker://[^/]+/sampler_weights/\S+-sampler-1", sampler_path)
    await model.sync_model_weights(1, SyncMethod.CHECKPOINT)
    assert model.model_path == sampler_path and await model.model_version_async == 1
    after = await model.logprobs_async(fixed)
    assert after.shape == before.shape
    assert (after - before).abs().max().item() > 1e-2, "the synced policy scores a fixed sequence as before"
    trained = await model.chat_async([dict(m) for m in messages], n=2, max_tokens=6, seed=7)
    assert len(trained) == 2 and all(len(e.logprobs) == len(e.tokens) - e.prompt_length for e in trained)

    # -- checkpoint and resume: save_state, then a new trainer resumes from it --------------------------
    await trainer.save_checkpoint()
    job_dir = Path(cfg.checkpoint_job_dir)
    assert (job_dir / "latest_checkpointed_iteration.txt").read_text() == "1"
    state_path = (job_dir / "global_step_1" / "remote_checkpoint_path.txt").read_text()
    assert re.fullmatch(r"tinker://[^/]+/weights/\S+-state-1", state_path)

    resumed = TinkerTrainerWrapper(cfg)
    await resumed.prepare()  # create_training_client_from_state_with_optimizer
    assert resumed.train_step_num == 1 and resumed.latest_remote_sampler_path == sampler_path
    resumed_sampler = await resumed.actor_client.save_weights_and_get_sampling_client()
    resumed_scores = await resumed_sampler.compute_logprobs(tinker.types.ModelInput.from_ints(fixed))
    assert resumed_scores[1:] == pytest.approx(after.tolist(), abs=1e-5)

    # both trainers take the same next step from the same state and optimizer: the same weights after it
    for experience in experiences:
        experience.logprobs = experience.logprobs.clone()
    second = await trainer.train_step(experiences)
    second_resumed = await resumed.train_step(experiences)
    assert trainer.train_step_num == resumed.train_step_num == 2
    assert second["actor/final_loss"] == pytest.approx(second_resumed["actor/final_loss"], abs=1e-5)
    continued = await (await trainer.actor_client.save_weights_and_get_sampling_client()
                       ).compute_logprobs(tinker.types.ModelInput.from_ints(fixed))
    continued_resumed = await (await resumed.actor_client.save_weights_and_get_sampling_client()
                               ).compute_logprobs(tinker.types.ModelInput.from_ints(fixed))
    assert continued[1:] == pytest.approx(continued_resumed[1:], abs=1e-5)
    assert continued[1:] != pytest.approx(after.tolist(), abs=1e-5)

    # the next sync: the step-2 sampler reaches the rollout model, and Trinity has the REST client delete the
    # step-1 sampler (by its bare name)
    await trainer.upload_state_dict()
    step2_path, version = no_ray.get_model_state_dict()
    assert version == 2 and step2_path.endswith("-sampler-2")
    await model.sync_model_weights(2, SyncMethod.CHECKPOINT)
    assert (await model.logprobs_async(fixed)).tolist() == pytest.approx(continued[1:], abs=2e-3)
    rest = tinker.ServiceClient().create_rest_client()  # the server and key from TINKER_BASE_URL / TINKER_API_KEY
    with pytest.raises(Exception, match="No checkpoint is saved"):
        rest.get_weights_info_by_tinker_path(sampler_path).result()
