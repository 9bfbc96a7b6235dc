"""On-policy distillation's teacher: the per-token advantage on real tiny models (hf teacher), and a
teacher served by the real `agenttune serve` scoring the student's tokens over /v1/completions."""

from __future__ import annotations

import random

import httpx
import pytest

from agenttune.errors import UserError
from agenttune.testing import tiny_model_path
from agenttune.testing.gateways import serve_process
from agenttune.workflow.episode import Episode, Sample
from agenttune.workflow.task import Task

torch = pytest.importorskip("torch")

STUDENT = "tiny://distil-student"  # the default tiny model's shape and tokenizer, other weights


def episodes(seed: int = 3) -> list[Episode]:
    """Three episodes with 4, 6 and 8 trained tokens (their rows are told apart by that count), each with
    two untrained tool-result tokens inside the response."""
    rng = random.Random(seed)
    made = []
    for index, trained in enumerate((4, 6, 8)):
        first = trained // 2
        response = [rng.randrange(10, 500) for _ in range(trained + 2)]
        mask = [1] * first + [0, 0] + [1] * (trained - first)
        prompt = [rng.randrange(10, 500) for _ in range(3 + index)]
        made.append(Episode(episode_id=f"e{index}", task=Task(task_id="t"), group_id="g", reward=float(index % 2),
                            samples=[Sample(prompt_ids=prompt, response_ids=response, loss_mask=mask,
                                            logprobs=[-1.0] * len(response))]))
    return made


def by_hand(model, episode: Episode, temperature: float) -> list[float]:
    """log p(token | before) of each trained token, from the model's own logits."""
    sample = episode.samples[0]
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0, :-1].float() / temperature, dim=-1)
    start = len(sample.prompt_ids)
    return [float(logprobs[start + i - 1, token]) for i, token in enumerate(sample.response_ids) if sample.loss_mask[i]]


def distillation_trainer(teacher_options: dict, temperature: float = 1.0):
    from agenttune.backbones.local.policy import load_policy
    from agenttune.backbones.local.train_step import GRPOTrainer
    from agenttune.registry.config_loading import load_config

    config = load_config({"model": {"path": STUDENT}, "rollout": {"temperature": temperature},
                          "algorithm": {"policy_loss": "distillation", "policy_loss_options": teacher_options}})
    model = load_policy(config, torch.device("cpu"))
    trainer = GRPOTrainer(model, config, pad_token_id=0, total_steps=2)
    seen: list = []
    real_loss = trainer.policy_loss

    def recording(batch):  # the real loss, its input kept
        seen.append(batch)
        return real_loss(batch)

    trainer.policy_loss = recording  # type: ignore[assignment]
    trainer.policy_loss.loss_agg_mode = real_loss.loss_agg_mode  # type: ignore[attr-defined]
    return trainer, model, seen


def advantages_by_episode(seen: list) -> dict[int, list[float]]:
    """Each row's per-token advantage (teacher log-prob minus the student's) on its trained tokens,
    keyed by the row's count of trained tokens."""
    found = {}
    for batch in seen:
        advantage = batch.teacher_logprobs - batch.old_logprobs
        for row in range(advantage.shape[0]):
            trained = batch.mask[row].bool()
            found[int(trained.sum())] = advantage[row][trained].tolist()
    return found


def test_each_tokens_advantage_is_the_teachers_log_prob_minus_the_students():
    from transformers import AutoModelForCausalLM

    teacher_dir = tiny_model_path()
    trainer, student, seen = distillation_trainer({"teacher": str(teacher_dir)}, temperature=0.8)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    batch = episodes()
    expected = {len(by_hand(student, e, 0.8)): [t - s for t, s in zip(by_hand(teacher, e, 0.8),
                                                                      by_hand(student, e, 0.8), strict=True)]
                for e in batch}
    metrics = trainer.step(batch)
    found = advantages_by_episode(seen)
    assert sorted(found) == [4, 6, 8]
    for trained, values in expected.items():
        assert found[trained] == pytest.approx(values, abs=1e-4)
    # the student's tokens differ from the teacher's: the advantages are not all ~0
    assert max(abs(v) for values in expected.values() for v in values) > 0.05
    every = [v for values in expected.values() for v in values]
    assert metrics["train/teacher_reverse_kl"] == pytest.approx(-sum(every) / len(every), abs=1e-4)


# -- a teacher behind `agenttune serve` ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def teacher_server(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("teacher") / "run"
    process, base_url = serve_process("--model", str(tiny_model_path()), "--run-dir", str(run_dir))
    yield base_url
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.slow
def test_serve_scores_token_id_prompts_as_vllm_does(teacher_server):
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    episode = episodes()[2]
    sample = episode.samples[0]
    ids = sample.prompt_ids + sample.response_ids
    scoring = episode.model_copy(update={"samples": [sample.model_copy(update={"loss_mask": [1] * len(ids)})]})
    expected = by_hand(teacher, scoring, 1.0)  # the response tokens' log-probs
    with httpx.Client(base_url=teacher_server, timeout=60) as client:
        echoed = client.post("completions", json={"model": "t", "prompt": ids, "max_tokens": 0, "echo": True,
                                                  "logprobs": 0}).json()["choices"][0]
        assert echoed["logprobs"]["token_logprobs"][0] is None and len(echoed["logprobs"]["tokens"]) == len(ids)
        assert echoed["logprobs"]["token_logprobs"][len(sample.prompt_ids):] == pytest.approx(expected, abs=1e-4)
        vllm_shape = client.post("completions", json={"model": "t", "prompt": ids, "max_tokens": 2,
                                                      "prompt_logprobs": 0, "temperature": 0}).json()["choices"][0]
        assert vllm_shape["prompt_logprobs"][0] is None and 1 <= len(vllm_shape["token_ids"]) <= 2
        entries = vllm_shape["prompt_logprobs"][len(sample.prompt_ids):]
        assert [entry[str(token)]["logprob"] for entry, token in zip(entries, sample.response_ids, strict=True)] \
            == pytest.approx(expected, abs=1e-4)
        for bad, field in [({"prompt_logprobs": 5}, "prompt_logprobs"), ({"prompt": [[1, 2], [3]]}, "prompt"),
                           ({"stream": True}, "stream"), ({"max_tokens": -1}, "max_tokens")]:
            refused = client.post("completions", json={"prompt": ids, "echo": True, "logprobs": 0, **bad})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text


@pytest.mark.slow
def test_a_served_teacher_gives_the_advantages_the_local_one_gives(teacher_server):
    from transformers import AutoModelForCausalLM

    trainer, student, seen = distillation_trainer({"teacher": "tiny-default", "teacher_engine": "openai",
                                                   "teacher_base_url": teacher_server})
    teacher = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    batch = episodes(seed=7)
    expected = {len(by_hand(student, e, 1.0)): [t - s for t, s in zip(by_hand(teacher, e, 1.0),
                                                                      by_hand(student, e, 1.0), strict=True)]
                for e in batch}
    trainer.step(batch)
    found = advantages_by_episode(seen)
    for trained, values in expected.items():
        assert found[trained] == pytest.approx(values, abs=1e-4)


def test_a_server_without_prompt_logprobs_is_a_clear_error():
    from agenttune.components.engines.openai import prompt_token_logprobs

    chat_like = {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}
    with pytest.raises(UserError, match=r"did not return the log-probabilities of the prompt's tokens .* `vllm serve TEACHER`"):
        prompt_token_logprobs(chat_like, [5, 6, 7], "http://127.0.0.1:9/v1")
    assert prompt_token_logprobs({"prompt_logprobs": [None, {"6": {"logprob": -1.5}}, {"7": {"logprob": -0.5}}]},
                                 [5, 6, 7], "s") == [-1.5, -0.5]


def test_an_unreachable_teacher_server_is_a_clear_error():
    from agenttune.backbones.local.logprobs import collate

    items_batch = collate(_items(), 0, "cpu")
    teacher = served_teacher("http://127.0.0.1:9/v1")
    try:
        with pytest.raises(UserError, match=r"teacher server at http://127\.0\.0\.1:9/v1 could not score"):
            teacher.score([items_batch])
    finally:
        teacher.close()


def served_teacher(base_url: str):
    from agenttune.backbones.local.teacher import load_teacher
    from agenttune.components.losses.distillation import DistillationOptions

    options = DistillationOptions(teacher="t", teacher_engine="openai", teacher_base_url=base_url)
    return load_teacher(options, _config(), None)  # type: ignore[arg-type]  # a server needs no student model


@pytest.mark.slow
def test_a_served_teacher_keeps_one_client_for_the_run_and_closes_it(teacher_server):
    """Every step's scoring goes through the same engine and HTTP client, on the teacher's own event loop
    (an httpx client belongs to the loop that first used it); the trainer's close ends both."""
    from agenttune.backbones.local.logprobs import collate

    trainer, _, _ = distillation_trainer({"teacher": "tiny-default", "teacher_engine": "openai",
                                          "teacher_base_url": teacher_server})
    teacher = trainer.teacher
    engine, client = teacher.engine, teacher.engine._client
    batch = collate(_items(), 0, "cpu")
    first = teacher.score([batch])[0]
    trainer.step(episodes(seed=5))
    assert teacher.score([batch])[0].tolist() == first.tolist()  # the same scores through the same client
    assert teacher.engine is engine and engine._client is client and not client.is_closed
    assert teacher._thread.is_alive()
    trainer.close()
    assert client.is_closed and not teacher._thread.is_alive()
    trainer.close()  # the end of a run that already closed it: nothing left to do


def test_teacher_engine_options_and_the_server_url_belong_to_their_engines():
    from pydantic import ValidationError

    from agenttune.components.losses.distillation import DistillationOptions

    assert DistillationOptions(teacher="t", teacher_engine="vllm",
                               teacher_engine_options={"gpu_memory_utilization": 0.3}).teacher_engine == "vllm"
    for bad, message in [
        ({"teacher_engine": "vllm", "teacher_base_url": "http://x/v1"}, "teacher_base_url is needed with "
                                                                        "teacher_engine: openai .* and only then"),
        ({"teacher_engine": "hf", "teacher_engine_options": {"sleep_level": 0}}, "teacher_engine_options sets up a "
                                                                                 "vLLM teacher"),
        ({"teacher_engine": "openai", "teacher_base_url": "http://x/v1", "teacher_engine_options": {"a": 1}},
         "remove it for teacher_engine: openai"),
        ({"teacher_engine": "sglang"}, "teacher_engine"),
    ]:
        with pytest.raises(ValidationError, match=message):
            DistillationOptions(teacher="t", **bad)


def test_a_vllm_teacher_without_vllm_installed_is_a_clear_error(monkeypatch):
    import importlib.util

    from agenttune.backbones.local.policy import load_policy
    from agenttune.backbones.local.teacher import load_teacher
    from agenttune.components.losses.distillation import DistillationOptions

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(
        name, *a))
    config = _config()
    options = DistillationOptions(teacher=str(tiny_model_path()), teacher_engine="vllm")
    with pytest.raises(UserError, match="teacher_engine is 'vllm' but vLLM is not installed") as error:
        load_teacher(options, config, load_policy(config, torch.device("cpu")))
    assert "pip install 'agenttune[vllm]'" in error.value.hint and "teacher_engine: hf" in error.value.hint


def test_a_vllm_teacher_is_checked_before_vllm_starts(monkeypatch, tmp_path):
    """Bad engine options and a teacher of another vocabulary are refused from config files alone."""
    import importlib.util
    import shutil

    from agenttune.backbones.local.policy import load_policy
    from agenttune.backbones.local.teacher import load_teacher
    from agenttune.components.engines import vllm as vllm_engine
    from agenttune.components.losses.distillation import DistillationOptions

    started = []
    monkeypatch.setattr(vllm_engine.VLLMEngine, "scorer", classmethod(lambda cls, *a: started.append(a)))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(
        name, *a))
    config = _config()
    student = load_policy(config, torch.device("cpu"))
    for bad, message in [({"sleep_level": 3}, "teacher_engine_options is not valid for a vLLM teacher"),
                         ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
                         ({"tensor_parallel": 2}, "tensor_parallel")]:
        with pytest.raises(UserError, match=message):
            load_teacher(DistillationOptions(teacher=str(tiny_model_path()), teacher_engine="vllm",
                                             teacher_engine_options=bad), config, student)
    other = tmp_path / "other-vocabulary"
    shutil.copytree(tiny_model_path(), other)
    import json

    settings = json.loads((other / "config.json").read_text())
    settings["vocab_size"] += 64
    (other / "config.json").write_text(json.dumps(settings))
    with pytest.raises(UserError, match=r"has a vocabulary of \d+ tokens, the student .* one of \d+"):
        load_teacher(DistillationOptions(teacher=str(other), teacher_engine="vllm"), config, student)
    assert started == []


def test_the_vllm_scorer_refuses_a_sleep_level_that_discards_the_teachers_weights(monkeypatch):
    import importlib.util

    from agenttune.components.engines.vllm import VLLMEngine, VLLMOptions

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(
        name, *a))
    with pytest.raises(UserError, match="sleep_level is 2, which discards its weights") as error:
        VLLMEngine.scorer(_config(), VLLMOptions(sleep_level=2), str(tiny_model_path()))
    assert "teacher_engine_options.sleep_level" in error.value.hint


def _config():
    from agenttune.registry.config_loading import load_config

    return load_config({"model": {"path": STUDENT}})


def test_an_openai_teacher_needs_its_server_url():
    from agenttune.registry.config_loading import load_config
    from agenttune.registry.resolution import resolve_objective

    config = load_config({"model": {"path": STUDENT}, "algorithm": {
        "policy_loss": "distillation", "policy_loss_options": {"teacher": "t", "teacher_engine": "openai"}}})
    with pytest.raises(UserError, match="teacher_base_url is needed with teacher_engine: openai"):
        resolve_objective(config)


def _items():
    from agenttune.backbones.local.batching import build_items

    made = episodes()
    items, _ = build_items(made, {e.episode_id: 0.0 for e in made}, max_prompt_length=64, max_response_length=64)
    return items


def test_training_closes_the_teacher_however_it_ends(monkeypatch):
    """`train` closes the trainer (and so a teacher's engine) after the loop, also when the loop fails."""
    import types

    from agenttune.backbones.local import loop

    closed = []
    trainer = types.SimpleNamespace(close=lambda: closed.append(True))
    monkeypatch.setattr(loop, "prepare", lambda run: types.SimpleNamespace(trainer=trainer))

    async def failing(run, setup):
        raise RuntimeError("a step failed")

    monkeypatch.setattr(loop, "training_loop", failing)
    with pytest.raises(RuntimeError, match="a step failed"):
        loop.train(None)  # type: ignore[arg-type]
    assert closed == [True]
