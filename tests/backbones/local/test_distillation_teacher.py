"""On-policy distillation's teacher: the per-token advantage on real tiny models (hf teacher), and a
teacher served by the real `agenttune serve` scoring the student's tokens over /v1/completions."""

from __future__ import annotations

import random

import httpx
import pytest

from agenttune.episode import Episode, Sample
from agenttune.errors import UserError
from agenttune.task import Task
from agenttune.testing import tiny_model_path
from agenttune.testing.gateways import serve_process

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
    from agenttune.backbones.local.trainer import GRPOTrainer
    from agenttune.config_loader import load_config

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
    from agenttune.engines.openai import prompt_token_logprobs

    chat_like = {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}
    with pytest.raises(UserError, match=r"did not return the log-probabilities of the prompt's tokens .* `vllm serve TEACHER`"):
        prompt_token_logprobs(chat_like, [5, 6, 7], "http://127.0.0.1:9/v1")
    assert prompt_token_logprobs({"prompt_logprobs": [None, {"6": {"logprob": -1.5}}, {"7": {"logprob": -0.5}}]},
                                 [5, 6, 7], "s") == [-1.5, -0.5]


def test_an_unreachable_teacher_server_is_a_clear_error():
    from agenttune.backbones.local.logprobs import collate
    from agenttune.backbones.local.teacher import ServedTeacher

    items_batch = collate(_items(), 0, "cpu")
    with pytest.raises(UserError, match=r"teacher server at http://127\.0\.0\.1:9/v1 could not score"):
        ServedTeacher("http://127.0.0.1:9/v1", "EMPTY", "t").logprobs(items_batch)


def test_an_openai_teacher_needs_its_server_url():
    from agenttune.components import resolve_objective
    from agenttune.config_loader import load_config

    config = load_config({"model": {"path": STUDENT}, "algorithm": {
        "policy_loss": "distillation", "policy_loss_options": {"teacher": "t", "teacher_engine": "openai"}}})
    with pytest.raises(UserError, match="teacher_base_url is needed with teacher_engine: openai"):
        resolve_objective(config)


def _items():
    from agenttune.backbones.local.batching import build_items

    made = episodes()
    items, _ = build_items(made, {e.episode_id: 0.0 for e in made}, max_prompt_length=64, max_response_length=64)
    return items
