"""On-policy distillation on verl 0.9.1: the translated `distillation` section passes verl's own config
classes, verl's real k1 policy-gradient distillation loss equals agenttune's `distillation` loss in
value and gradient, and what verl cannot run as the same rule is refused in one paragraph.
"""

from __future__ import annotations

import pytest
import torch
from agenttune_verl.backbone import config_problems
from agenttune_verl.translation import VerlPaths
from agenttune_verl.verl_config import build_verl_config
from tensordict import TensorDict
from verl.trainer.distillation.losses import distillation_ppo_loss
from verl.utils.config import omega_conf_to_dataclass

from agenttune.plugin_api import LossInput, UserError, get_component, load_config

PATHS = VerlPaths("/run/train.parquet", "/run/val.parquet", "/run/loops.yaml", "/run/checkpoints")
TEACHER_POOL = {"distillation": {"nnodes": 1}}


def distillation_config(model: str, *, verl: dict | None = None, rollout: dict | None = None, **options):
    return load_config({
        "model": {"path": model},
        "algorithm": {"policy_loss": "distillation", "policy_loss_options": {"teacher": model, **options}},
        "rollout": {"temperature": 1.0, **(rollout or {})},
        "trainer": {"n_gpus_per_node": 2},
        "verl": TEACHER_POOL if verl is None else verl,
    }, backbone="verl")


@pytest.mark.parametrize("reward_weight", [0.0, 1.0])
def test_generated_distillation_section_passes_verls_own_config_classes(tiny_model_path, reward_weight):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = distillation_config(str(tiny_model_path), reward_weight=reward_weight)
    assert config_problems(config) == []
    verl_config = build_verl_config(config, PATHS)
    validate_config(verl_config, use_reference_policy=need_reference_policy(verl_config),
                    use_critic=need_critic(verl_config))
    section = omega_conf_to_dataclass(verl_config.distillation)
    loss = section.distillation_loss
    assert section.enabled and loss.loss_mode == "k1" and loss.use_policy_gradient
    assert loss.use_task_rewards is (reward_weight == 1.0) and loss.distillation_loss_coef == 1.0
    assert loss.loss_max_clamp is None
    assert (section.nnodes, section.n_gpus_per_node) == (1, 2)
    teacher = section.teacher_models["default"]
    assert teacher.model_path == str(tiny_model_path)
    assert teacher.num_replicas * teacher.per_replica_world_size == 2  # verl filled the teacher's pool
    # the task-reward part of the loss is verl's vanilla PPO loss (ratio 1 on the single update per step)
    assert verl_config.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"


def test_a_vllm_teacher_is_served_by_verl_as_an_hf_one_is(tiny_model_path):
    """teacher_engine hf and vllm both name a directory loaded beside the student; verl serves either."""
    sections = [build_verl_config(distillation_config(str(tiny_model_path), teacher_engine=engine), PATHS).distillation
                for engine in ("hf", "vllm")]
    assert sections[0] == sections[1]
    assert config_problems(distillation_config(str(tiny_model_path), teacher_engine="vllm")) == []


def test_other_losses_leave_verls_distillation_defaults(tiny_model_path):
    config = load_config({"model": {"path": str(tiny_model_path)}, "trainer": {"n_gpus_per_node": 2}},
                         backbone="verl")
    section = build_verl_config(config, PATHS).distillation
    assert section.enabled is False and section.distillation_loss.loss_mode == "k3"
    assert section.teacher_models.teacher_model.model_path is None


def verl_batch(current, old, teacher, advantages, mask) -> tuple[dict, TensorDict]:
    """The micro-batch as verl's actor hands it to its loss: model outputs unpadded (one prompt token and
    the response per row, each row's log-probs shifted one left), the rest padded [rows, tokens]."""
    rows, tokens = mask.shape

    def unpadded(values: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.cat([row, row.new_zeros(1)]) for row in values])

    data = TensorDict({
        "prompts": torch.ones(rows, 1, dtype=torch.long),
        "responses": torch.ones(rows, tokens, dtype=torch.long),
        "attention_mask": torch.ones(rows, 1 + tokens, dtype=torch.long),
        "response_mask": mask.bool(),
        "old_log_probs": old,
        "advantages": advantages.unsqueeze(-1).expand_as(mask).clone(),
        "teacher_logprobs": torch.nested.nested_tensor(
            [torch.cat([row, row.new_zeros(1)]).unsqueeze(-1) for row in teacher], layout=torch.jagged),
    }, batch_size=[rows])
    for key, value in {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None}.items():
        data.set_non_tensor(key, value)
    return {"log_probs": unpadded(current)}, data


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("reward_weight", "aggregation"), [(0.0, "token-mean"), (1.0, "token-mean"),
                                                             (0.0, "seq-mean-token-mean"),
                                                             (1.0, "seq-mean-token-mean")])
def test_verls_k1_policy_gradient_distillation_equals_agenttunes(tiny_model_path, seed, reward_weight, aggregation):
    """On the single update per step (π_θ = π_old in value, as the plugin configures verl)."""
    generator = torch.Generator().manual_seed(seed)
    rows, tokens = 5, 7
    student = -torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 3
    teacher = -torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 3
    advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
    lengths = torch.randint(1, tokens + 1, (rows,), generator=generator)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).to(torch.float64)

    config = distillation_config(str(tiny_model_path), reward_weight=reward_weight,
                                 verl={**TEACHER_POOL, "actor_rollout_ref.actor.loss_agg_mode": aggregation})
    loss = get_component("policy_losses", "distillation")(
        get_component("policy_losses", "distillation").Options(teacher="t", reward_weight=reward_weight))
    ours_input = student.clone().requires_grad_()
    per_token = loss(LossInput(ours_input, student, advantages, mask, clip_low=0.2, clip_high=0.28,
                               teacher_logprobs=teacher)).per_token
    if aggregation == "token-mean":
        ours = (per_token * mask).sum() / mask.sum()
    else:
        ours = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    ours.backward()

    verl_config = build_verl_config(config, PATHS)
    actor = omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor)
    section = omega_conf_to_dataclass(verl_config.distillation)
    theirs_input = student.clone().requires_grad_()
    model_output, data = verl_batch(theirs_input, student, teacher, advantages, mask)
    theirs, _ = distillation_ppo_loss(config=actor, distillation_config=section, model_output=model_output,
                                      data=data)
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(ours_input.grad, theirs_input.grad, rtol=1e-9, atol=1e-12)
    # the per-token advantage's sign: tokens the teacher finds likelier than the student are pushed up
    assert ((ours_input.grad * mask) < 0).eq((teacher - student + reward_weight * advantages[:, None]) * mask > 0).all()


def test_other_reward_weights_differ_by_a_factor_on_the_whole_loss(tiny_model_path):
    """Why reward_weight 0.5 is refused: verl's nearest setting (task loss + 2 x distillation loss) is
    agenttune's loss times 2, not agenttune's loss."""
    generator = torch.Generator().manual_seed(0)
    student = -torch.rand(3, 4, generator=generator, dtype=torch.float64)
    teacher = -torch.rand(3, 4, generator=generator, dtype=torch.float64)
    advantages, mask = torch.randn(3, generator=generator, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64)
    options = get_component("policy_losses", "distillation").Options(teacher="t", reward_weight=0.5)
    ours = (get_component("policy_losses", "distillation")(options)(LossInput(
        student, student, advantages, mask, 0.2, 0.2, teacher_logprobs=teacher)).per_token).mean()
    config = distillation_config(str(tiny_model_path), reward_weight=1.0, verl={
        **TEACHER_POOL, "distillation.distillation_loss.distillation_loss_coef": 2.0})
    verl_config = build_verl_config(config, PATHS)
    theirs, _ = distillation_ppo_loss(
        config=omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor),
        distillation_config=omega_conf_to_dataclass(verl_config.distillation),
        model_output=verl_batch(student, student, teacher, advantages, mask)[0],
        data=verl_batch(student, student, teacher, advantages, mask)[1])
    assert float(theirs) == pytest.approx(2 * float(ours), rel=1e-9)
    assert float(theirs) != pytest.approx(float(ours), rel=1e-3)
    assert "reward_weight=0.5 has no equivalent" in " ".join(
        str(p) for p in config_problems(distillation_config(str(tiny_model_path), reward_weight=0.5)))


@pytest.mark.parametrize(("options", "sections", "words"), [
    ({"teacher_engine": "openai", "teacher_base_url": "http://127.0.0.1:8000/v1"}, {},
     "teacher_engine='openai' has no equivalent in verl 0.9.1: verl serves the distillation teacher itself"),
    ({"teacher_engine": "vllm", "teacher_engine_options": {"gpu_memory_utilization": 0.3}}, {},
     "teacher_engine_options set up agenttune's own vLLM teacher; verl 0.9.1 serves the teacher itself"),
    ({"reward_weight": 0.3}, {}, "reward_weight=0.3 has no equivalent"),
    ({}, {"algorithm": {"kl_coef": 0.01}}, "kl_coef=0.01 with pure distillation"),
    ({}, {"algorithm": {"rollout_correction": {"bypass_mode": True, "rollout_is": "token"}}},
     "bypass_mode with policy_loss distillation"),
    ({}, {"rollout": {"temperature": 0.8}}, "rollout.temperature=0.8 with policy_loss distillation"),
])
def test_what_verl_cannot_run_as_the_same_rule_is_refused(tiny_model_path, options, sections, words):
    raw = distillation_config(str(tiny_model_path), **options).model_dump()
    for name, values in sections.items():
        raw[name].update(values)
    config = load_config(raw, backbone="verl")
    problems = [str(problem) for problem in config_problems(config)]
    assert any(words in problem for problem in problems), problems


def test_a_teacher_without_gpus_is_refused_before_the_run(tiny_model_path):
    config = distillation_config(str(tiny_model_path), verl={})
    with pytest.raises(UserError, match="needs GPUs for the teacher") as raised:
        build_verl_config(config, PATHS)
    assert "distillation: {nnodes: 1}" in raised.value.render()


def test_a_teacher_pool_verl_cannot_fill_is_refused_with_verls_reason(tiny_model_path):
    config = distillation_config(str(tiny_model_path), verl={"distillation": {"nnodes": 1, "n_gpus_per_node": 3}})
    with pytest.raises(UserError, match="verl 0.9.1 refuses the distillation section: .*must divide"):
        build_verl_config(config, PATHS)


def test_the_gpu_check_counts_the_teachers_gpus(tiny_model_path):
    from agenttune_verl.launch import check_gpus

    config = distillation_config(str(tiny_model_path))  # actor 2 GPUs, teacher 1 node x 2
    check_gpus(config, {"GPU": 4}, where="here")
    with pytest.raises(UserError, match=r"asks for 4 \(.* \+ 2 for the distillation teacher"):
        check_gpus(config, {"GPU": 3}, where="here")
