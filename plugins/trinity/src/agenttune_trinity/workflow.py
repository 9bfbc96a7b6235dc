"""The Trinity workflow that runs an agenttune workflow.

Trinity finds it by its dotted path (`default_workflow_type: agenttune_trinity.workflow.AgentTuneWorkflow`,
see translation.py); importing this module also registers it as `agenttune_workflow` in Trinity's
`WORKFLOWS` registry. For one task it runs the user's workflow `repeat_times` times (the GRPO group)
through agenttune's rollout engine: every chat call goes through the gateway to Trinity's rollout
model as token ids, the configured judge scores each episode, the episodes are appended to the rollout
log in the run directory, and their merged timeline samples come back as Experiences. For on-policy
distillation the teacher (Trinity's first auxiliary model) scores them (teacher.py).
"""

from __future__ import annotations

import os
from typing import Any

from trinity.common.workflows import WORKFLOWS
from trinity.common.workflows.workflow import Task, Workflow

from agenttune.plugin_api import Episode, RolloutLog, SamplingParams, TokenText, to_record
from agenttune_trinity.experiences import group_experiences
from agenttune_trinity.stack import AgentTuneStack, stack_for
from agenttune_trinity.taskset import task_from_row
from agenttune_trinity.teacher import score_with_teacher, the_teacher

TRAIN, VALIDATION = "train", "validation"


@WORKFLOWS.register_module("agenttune_workflow")
class AgentTuneWorkflow(Workflow):
    """Runs the configured agenttune workflow on one Trinity task, once per repeat."""

    is_async = True
    can_repeat = True  # the whole group runs at once, through agenttune's rollout engine
    can_reset = True  # one instance per runner: the agenttune stack outlives tasks anyway

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.reset(task)

    def reset(self, task: Task) -> None:
        self.task = task
        self.repeat_times = task.repeat_times or 1
        self.run_id_base = 0

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    async def run_async(self) -> list[Any]:
        stack = await stack_for(self.model, self.task.workflow_args)
        task = task_from_row(self.task.raw_task)
        episodes = await stack.session.rollout.run_tasks([task], num_repeat=self.repeat_times,
                                                          sampling=self.sampling())
        write_rollout_log(stack, episodes, step=self.step(), split=VALIDATION if self.task.is_eval else TRAIN)
        algorithm = stack.config.algorithm
        experiences = group_experiences(episodes, run_id_base=self.run_id_base,
                                        pad_token_id=pad_token_id(stack.session.tokenizer),
                                        limits=stack.config.data.length_limits(),
                                        overlong=None if self.task.is_eval else algorithm.overlong_shaping)
        if not experiences:
            # Trinity records the task as failed (and may retry it); say why in its log.
            raise RuntimeError(f"every episode of task {task.task_id!r} failed: " + "; ".join(
                f"{episode.status.value}: {(episode.error or '').splitlines()[0][:300] if episode.error else '?'}"
                for episode in episodes))
        if algorithm.policy_loss == "distillation" and not self.task.is_eval:
            await score_with_teacher(experiences, the_teacher(self.auxiliary_model_wrappers),
                                     temperature=stack.config.rollout.temperature)
        return experiences

    def sampling(self) -> SamplingParams:
        """Trinity's rollout args for this task (the train or validation taskset's)."""
        args = self.task.rollout_args
        return SamplingParams(
            temperature=1.0 if args.temperature is None else args.temperature,
            top_p=1.0 if args.top_p is None else args.top_p,
            top_k=-1 if args.top_k is None else args.top_k,
            max_tokens=args.max_tokens or 512,
        )

    def step(self) -> int:
        """The explorer step: Trinity's batch id is the step, or "step/taskset" for validation."""
        batch = str(self.task.batch_id).split("/", 1)[0]
        return int(batch) if batch.isdigit() else 0


def write_rollout_log(stack: AgentTuneStack, episodes: list[Episode], *, step: int, split: str) -> None:
    """Append the episodes to `<run_dir>/rollouts/` in one write.

    Several runner processes append to the same step's file at once; one `write` on an O_APPEND
    descriptor keeps their records from interleaving.
    """
    log = RolloutLog.for_run(stack.run)
    token_text = TokenText(stack.session.tokenizer)
    text = "".join(to_record(episode, step=step, split=split, token_text=token_text).model_dump_json() + "\n"
                   for episode in episodes)
    log.dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(log.path(step, split), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, text.encode("utf-8"))
    finally:
        os.close(descriptor)


def pad_token_id(tokenizer: Any) -> int:
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0
