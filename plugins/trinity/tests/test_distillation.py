"""On-policy distillation on the trinity backbone: agenttune's `distillation` loss becomes Trinity-RFT
0.6.0's own `on_policy_distill` algorithm, with the teacher as Trinity's first auxiliary model.

Trinity's real config loader and validators judge the translated config; Trinity's own advantage
and policy-loss functions, built from it, compute the same loss and gradient as agenttune's
distillation loss on a random batch; agenttune's Trinity workflow fills `Experience.teacher_logprobs`
from the auxiliary model, aligned with the response tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agenttune_trinity.launch import check_and_update
from test_translation import loaded
from test_workflow import NotARayActor, Scripted, prepared_model, trinity_tasks

from agenttune.plugin_api import UserError


@pytest.fixture
def distill_config(make_config, tiny_model_path: Path):
    def make(n_gpus: int = 4, nnodes: int = 1, **options):
        return make_config(
            trainer={"n_gpus_per_node": n_gpus, "nnodes": nnodes, "learning_rate": 2e-6},
            algorithm={"policy_loss": "distillation", "loss_agg_mode": "token-mean",
                       "policy_loss_options": {"teacher": str(tiny_model_path), **options}})
    return make


@pytest.mark.parametrize(("gpus", "nodes", "rollout", "trainer"), [(4, 1, 1, 2), (3, 1, 1, 1), (4, 2, 3, 4)])
def test_distillation_becomes_trinitys_on_policy_distill(distill_config, tmp_path: Path, tiny_model_path,
                                                          gpus, nodes, rollout, trainer):
    from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE, POLICY_LOSS_FN

    cfg = loaded(distill_config(gpus, nodes), tmp_path)
    check_and_update(cfg)  # Trinity's validators: algorithm defaults, GPU split, auxiliary models

    algorithm = cfg.algorithm
    assert algorithm.algorithm_type == "on_policy_distill"
    assert ALGORITHM_TYPE.get("on_policy_distill").compute_advantage_in_trainer
    assert (algorithm.advantage_fn, algorithm.advantage_fn_args) == ("on_policy_distill", {"kl_coef": 1.0})
    assert algorithm.policy_loss_fn == "importance_sampling"
    assert algorithm.policy_loss_fn_args == {"loss_agg_mode": "token-mean"}
    assert (algorithm.kl_loss_fn, algorithm.kl_penalty_fn, algorithm.entropy_loss_fn) == ("none", "none", "none")
    # what Trinity's trainer builds from these: the arguments fit the functions' constructors
    ADVANTAGE_FN.get(algorithm.advantage_fn)(**algorithm.advantage_fn_args)
    POLICY_LOSS_FN.get(algorithm.policy_loss_fn)(**algorithm.policy_loss_fn_args)

    [teacher] = cfg.explorer.auxiliary_models
    assert (teacher.model_path, teacher.engine_type, teacher.engine_num) == (str(tiny_model_path), "vllm", 1)
    assert teacher.tensor_parallel_size == 1 and teacher.enable_openai_api
    # the teacher's GPU comes out of the run's before rollout and training split the rest
    assert (cfg.cluster.rollout_gpu_num, cfg.cluster.auxiliary_model_gpu_num, cfg.cluster.trainer_gpu_num) == (
        rollout, 1, trainer)


def test_a_vllm_teacher_is_the_same_auxiliary_model_as_an_hf_one(distill_config, tmp_path: Path):
    """teacher_engine hf and vllm both name a directory: Trinity serves either as its auxiliary vLLM model."""
    hf, vllm = (loaded(distill_config(teacher_engine=engine), tmp_path / engine) for engine in ("hf", "vllm"))
    assert vllm.explorer.auxiliary_models == hf.explorer.auxiliary_models and vllm.algorithm == hf.algorithm


def test_other_losses_keep_their_clip_range_and_no_teacher(make_config, tmp_path: Path):
    cfg = loaded(make_config(algorithm={"policy_loss": "ppo_clip", "clip_ratio_high": 0.28}), tmp_path)
    assert cfg.explorer.auxiliary_models == [] and cfg.algorithm.algorithm_type == "multi_step_grpo"
    assert cfg.algorithm.policy_loss_fn_args["clip_range_high"] == 0.28


@pytest.mark.parametrize(("gpus", "options", "algorithm", "message"), [
    (4, {"teacher_engine": "openai", "teacher_base_url": "http://127.0.0.1:8000/v1"}, {},
     "teacher_engine='openai' has no equivalent in Trinity-RFT 0.6.0"),
    (4, {"teacher_engine": "vllm", "teacher_engine_options": {"gpu_memory_utilization": 0.3}}, {},
     "teacher_engine_options set up agenttune's own vLLM teacher; Trinity-RFT 0.6.0 serves the teacher"),
    (4, {"reward_weight": 0.5}, {}, "reward_weight=0.5 has no equivalent in Trinity-RFT 0.6.0"),
    (4, {}, {"kl_coef": 0.05}, "kl_coef=0.05 with policy_loss distillation has no equivalent"),
    (1, {}, {}, "needs at least 3 GPUs"),
    (2, {}, {}, "needs at least 3 GPUs"),
    (4, {"teacher": "tiny://qwen"}, {}, "not agenttune's tiny:// test models"),
    (4, {"teacher_engine": "openai"}, {}, "Invalid algorithm.policy_loss_options for 'distillation'"),
])
def test_what_trinitys_distillation_lacks_is_refused(make_config, tiny_model_path, gpus, options, algorithm, message):
    from agenttune_trinity.backbone import TrinityBackbone

    config = make_config(trainer={"n_gpus_per_node": gpus},
                         algorithm={"policy_loss": "distillation", **algorithm,
                                    "policy_loss_options": {"teacher": str(tiny_model_path), **options}})
    with pytest.raises(UserError) as caught:
        TrinityBackbone.check(config)
    assert message in str(caught.value) and caught.value.hint


def test_trinitys_distillation_equals_agenttunes_loss_on_a_random_batch():
    """Trinity's on_policy_distill advantage + importance_sampling loss vs agenttune's distillation loss:
    the same loss value and the same gradient, also off-policy (π_θ ≠ π_old)."""
    import torch
    from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN
    from verl import DataProto

    from agenttune.plugin_api import LossInput, get_component

    generator = torch.Generator().manual_seed(37)
    rows, tokens = 6, 20
    old = -torch.rand(rows, tokens, generator=generator) * 3
    teacher = -torch.rand(rows, tokens, generator=generator) * 3
    current = old + torch.randn(rows, tokens, generator=generator) * 0.2
    lengths = torch.randint(1, tokens + 1, (rows,), generator=generator)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).float()
    mask[0, :3] = 0  # a tool result inside a multi-turn response: not trained

    data = DataProto.from_dict(tensors={"old_log_probs": old, "teacher_logprobs": teacher, "response_mask": mask})
    data, _ = ADVANTAGE_FN.get("on_policy_distill")(kl_coef=1.0)(data)
    theirs_logprob = current.clone().requires_grad_(True)
    theirs, _ = POLICY_LOSS_FN.get("importance_sampling")(loss_agg_mode="token-mean")(
        logprob=theirs_logprob, old_logprob=old, action_mask=mask, advantages=data.batch["advantages"])
    theirs.backward()

    ours_logprob = current.clone().requires_grad_(True)
    loss_cls = get_component("policy_losses", "distillation")  # agenttune's built-in, as the local trainer gets it
    loss = loss_cls(loss_cls.Options(teacher="t"))
    output = loss(LossInput(logprobs=ours_logprob, old_logprobs=old, advantages=torch.zeros(rows), mask=mask,
                            clip_low=0.2, clip_high=0.2, teacher_logprobs=teacher))
    ours = (output.per_token * mask).sum() / mask.sum()  # token-mean, as the local trainer aggregates
    ours.backward()

    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert torch.allclose(ours_logprob.grad, theirs_logprob.grad, atol=1e-7)
    assert float(ours_logprob.grad.abs().sum()) > 0


class TeacherActor:
    """Stands where Trinity puts the teacher's vLLM actor (GPU-only). `logprobs.remote(tokens, temperature)`
    computes what vLLM's prompt_logprobs give, `logprobs[i] = log p(token i+1 | tokens ≤ i)`, with a real
    transformers model; every call is recorded."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, []
        self.logprobs = self

    def remote(self, tokens: list[int], temperature: float | None = None):
        self.calls.append((list(tokens), temperature))
        return self._score(tokens, temperature or 1.0)

    async def _score(self, tokens, temperature):
        return teacher_logprobs(self.model, tokens, temperature)


def teacher_logprobs(model, tokens: list[int], temperature: float):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]


async def test_the_workflow_scores_experiences_with_the_auxiliary_teacher(distill_config, tmp_path: Path,
                                                                          tiny_model_path, tiny_tokenizer):
    import json

    from agenttune_trinity.launch import write_tasksets
    from agenttune_trinity.stack import close_all
    from agenttune_trinity.translation import TrinityPaths
    from fake_vllm import FakeVLLMServer
    from transformers import AutoModelForCausalLM
    from trinity.common.experience import Experience
    from trinity.common.models.model import ModelWrapper

    from agenttune.plugin_api import prepare_run, resolve
    from agenttune.testing.loopback import serve_app

    config = distill_config()
    run = prepare_run(config, tmp_path / "run")
    paths = TrinityPaths.for_run(run.run_dir, str(tiny_model_path))
    cfg = loaded_for_run(config, paths, run.run_dir)
    write_tasksets(resolve(config), config, Path(paths.tasks))
    check_and_update(cfg)

    teacher_model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    actor = TeacherActor(teacher_model)
    teacher = ModelWrapper(model=actor, config=cfg.explorer.auxiliary_models[0], api_address="http://unused")
    server = FakeVLLMServer(tiny_tokenizer, Scripted())
    with serve_app(server.app()) as address:
        model = await prepared_model(cfg, address)
        [task] = [t for t in await trinity_tasks(cfg, 3)
                  if json.loads(t.raw_task["agenttune_task"])["query"] == "What is 40 + 2?"]
        workflow = task.to_workflow(model, [teacher])
        workflow.set_repeat_times(2, run_id_base=0)
        try:
            experiences = await workflow.run_async()
        finally:
            await close_all()

    assert len(experiences) == 2 and len(actor.calls) == 2
    for experience in experiences:
        tokens = experience.tokens.tolist()
        assert (tokens, 0.9) in actor.calls  # the whole sequence, at rollout.temperature
        response = len(tokens) - experience.prompt_length
        expected = teacher_logprobs(teacher_model, tokens, 0.9)[experience.prompt_length - 1:]
        assert experience.teacher_logprobs.shape == (response,)
        assert torch_close(experience.teacher_logprobs, expected)
    # Trinity's buffer serialization keeps them for its trainer
    restored = Experience.deserialize_many(Experience.serialize_many(experiences))
    assert all(torch_close(a.teacher_logprobs, b.teacher_logprobs) for a, b in zip(restored, experiences, strict=True))


async def test_a_runner_without_the_teacher_is_a_clear_error():
    from agenttune_trinity.teacher import the_teacher

    with pytest.raises(UserError, match="needs the teacher as Trinity's first auxiliary model"):
        the_teacher([])
    assert the_teacher([NotARayActor]) is NotARayActor


def loaded_for_run(config, paths, run_dir: Path):
    from agenttune_trinity.launch import load_trinity_config, write_trinity_config
    from agenttune_trinity.translation import trinity_config

    return load_trinity_config(write_trinity_config(trinity_config(config, paths), run_dir))


def torch_close(a, b) -> bool:
    import torch

    return bool(torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=1e-5))
