"""The local training loop: roll out a batch, take a GRPO step, validate, checkpoint, repeat.

When synchronous, rollouts and training share one model object: the `hf` engine samples from the
very weights the trainer updates, so nothing is copied between steps (`vllm` holds its own copy,
asleep during the update). When asynchronous, the engine samples from weights of its own (`hf`: a
frozen copy; `vllm`: its own, never asleep) that `engine.sync_weights` refreshes after every step.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import agenttune.backbones.local.checkpoint as checkpoints
from agenttune.backbones.local.async_rollouts import GroupPipeline, staleness_metrics
from agenttune.backbones.local.dynamic_sampling import fill_batch, is_informative
from agenttune.backbones.local.logprobs import pad_token_id
from agenttune.backbones.local.monitor import Trackers
from agenttune.backbones.local.options import local_options, trains_adapters
from agenttune.backbones.local.policies import PolicyTrainers
from agenttune.backbones.local.policy import (
    Policy,
    count_parameters,
    load_policy,
    reference_scope,
    resolve_device,
)
from agenttune.backbones.local.progress import TrainingProgress
from agenttune.backbones.local.report import PLOT_NAME, plot_curves, summary_table
from agenttune.backbones.local.task_order import TaskOrder
from agenttune.backbones.local.train_step import GRPOTrainer
from agenttune.components.engines.hf import intra_op_executor
from agenttune.components.engines.model_loading import load_tokenizer, resolve_model_path
from agenttune.config.run import Run, get_logger
from agenttune.errors import UserError
from agenttune.rollout.log import RolloutLog
from agenttune.rollout.metrics import MetricsLog
from agenttune.rollout.rollout_engine import sampling_params
from agenttune.workflow.episode import Episode
from agenttune.workflow.task import Task

log = get_logger("local")


@dataclass
class Setup:
    """Everything built before the first rollout."""

    model: Policy
    tokenizer: Any
    trainer: GRPOTrainer | PolicyTrainers
    order: TaskOrder
    validation: list[Task]
    total_steps: int
    start_step: int
    components: Any
    engine: Any = None
    pending: list[Task] = field(default_factory=list)  # async: tasks taken but not trained at the checkpoint
    pipeline: Any = None  # async: the GroupPipeline
    update_thread: ThreadPoolExecutor | None = None  # async: where the update runs (`update_executor`)


def train(run: Run) -> None:
    from agenttune.rollout.session import run_until_done

    setup = prepare(run)
    try:
        run_until_done(training_loop(run, setup))
    finally:
        setup.trainer.close()  # a distillation teacher's engine


# -- setup ------------------------------------------------------------------------------------------
def prepare(run: Run) -> Setup:
    from agenttune.registry.resolution import components_for

    config = run.config
    _seed_everything(config.trainer.seed)
    components = components_for(run)
    reader = config.task_reader
    train_tasks = _read(components, reader.train_split,
                        endless_take=(config.trainer.total_steps or 0) * config.data.train_batch_size,
                        take_key="trainer.total_steps")
    validation = (_read(components, reader.validation_split, endless_take=config.data.val_batch_size or 0,
                        take_key="data.val_batch_size") if reader.validation_split else [])
    if config.data.val_batch_size:
        validation = validation[: config.data.val_batch_size]
    order = TaskOrder(train_tasks, config.data.train_batch_size, config.trainer.seed, shuffle=config.data.shuffle)
    total_steps = config.trainer.total_steps or config.trainer.total_epochs * order.batches_per_epoch

    resume_from = _resume_checkpoint(run)
    local = local_options(config)
    device = resolve_device(local.device)
    tokenizer = load_tokenizer(config.model)
    _quiet_transformers()
    model = load_policy(config, device, checkpoint=resume_from / "model" if resume_from else None)
    trainable, total = count_parameters(model)
    log.info("policy loaded", device=str(device), dtype=str(next(model.parameters()).dtype),
             trainable_parameters=trainable, parameters=total, lora=local.lora_rank > 0)
    if resume_from is None and local.warmup.data:
        _warm_up(run, model, tokenizer, local.warmup.data)
    reference = reference_scope(config, model, device)

    def make_trainer(trainer_config: Any) -> GRPOTrainer:
        return GRPOTrainer(model, trainer_config, pad_token_id=pad_token_id(tokenizer), total_steps=total_steps,
                           reference=reference, estimator=components.estimator, policy_loss=components.policy_loss)

    trainer: GRPOTrainer | PolicyTrainers
    if config.policies.enabled:  # one trainer per policy, each on its own agents' samples
        trainer = PolicyTrainers(model, config, make_trainer)
    else:
        trainer = make_trainer(config)
    start_step, pending = 0, []
    if resume_from is not None:
        state = checkpoints.read_state(resume_from)
        trainer.load_state_dict(checkpoints.load_trainer_state(resume_from))
        order.load_state_dict(state.task_order)
        checkpoints.restore_rng(resume_from)
        start_step = state.step
        pending = [Task.model_validate(task) for task in state.extra.get("pending_tasks", [])]
        _forget_steps_after(run, start_step)
        log.info("resumed", checkpoint=str(resume_from), step=start_step)
    return Setup(model, tokenizer, trainer, order, validation, total_steps, start_step, components, pending=pending)


def _read(components: Any, split: str, *, endless_take: int, take_key: str) -> list[Task]:
    """Every task of `split`; of an endless split (a generator's stream), the first `endless_take`."""
    limit = None
    if components.task_reader().endless(split):
        if not endless_take:
            raise UserError(f"The split {split!r} is endless, so the local backbone needs {take_key} to know how "
                            f"many of its tasks to take.", hint=f"Set {take_key}, or give the split a size in the "
                                                                 "task reader's options.")
        limit = endless_take
    tasks = list(components.read_tasks(split, limit=limit))
    if not tasks:
        raise UserError(f"The task reader found no tasks in split {split!r}.",
                        hint="Check task_reader's settings and the split names.")
    return tasks


def _resume_checkpoint(run: Run) -> Path | None:
    if not run.resume:
        if checkpoints.list_checkpoints(run.checkpoints_dir) or MetricsLog(run.metrics_path).read():
            raise UserError(f"The run directory {str(run.run_dir)!r} already holds a training run.",
                            hint="Pass --resume to continue it, or choose a new --run-dir.")
        return None
    found = checkpoints.latest_checkpoint(run.checkpoints_dir)
    if found is None:
        raise UserError(f"--resume: there is no checkpoint in {str(run.checkpoints_dir)!r}.",
                        hint="Start without --resume, or pass the --run-dir of a run that saved checkpoints "
                             "(trainer.save_freq).")
    return found


def _forget_steps_after(run: Run, step: int) -> None:
    """Drop metrics and rollout logs of steps after the checkpoint: they are about to be trained again
    (the rollout log appends, so a crashed run's episodes would otherwise stay beside the new ones)."""
    metrics = MetricsLog(run.metrics_path)
    kept = [record for record in metrics.read() if record.get("step", 0) <= step]
    run.metrics_path.write_text("".join(_json_line(record) for record in kept), encoding="utf-8")
    for path in RolloutLog.for_run(run).files():  # step_{step:06d}_{split}.jsonl
        if int(path.name.split("_")[1]) > step:
            path.unlink()


def _json_line(record: dict[str, Any]) -> str:
    import json

    return json.dumps(record) + "\n"


def _warm_up(run: Run, model: torch.nn.Module, tokenizer: Any, data: str) -> None:
    from agenttune.backbones.local.warmup import warm_up_on_file

    config = run.config
    warmup = local_options(config).warmup
    log.info("supervised warm-up", data=data, steps=warmup.steps)
    started = time.perf_counter()
    with TrainingProgress(warmup.steps, label="warm-up") as progress:
        metrics = warm_up_on_file(
            model, tokenizer, data, steps=warmup.steps, batch_size=warmup.batch_size,
            learning_rate=warmup.learning_rate, micro_batch_tokens=local_options(config).micro_batch_tokens,
            seed=config.trainer.seed, on_step=lambda step, m: progress.warmup_step(step, m),
        )
    log.info("warm-up done", seconds=round(time.perf_counter() - started, 1), **metrics)


def _quiet_transformers() -> None:
    """transformers' own progress bars (loading, saving shards) would tear through ours."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


# -- the loop ---------------------------------------------------------------------------------------
async def training_loop(run: Run, setup: Setup) -> None:
    from agenttune.registry.resolution import build_engine, engine_class
    from agenttune.rollout.session import rollout_session

    config = run.config
    bound = config.trainer.staleness_bound
    rollout_weights = rollout_model(setup.model, bound, engine_copies=engine_class(config).copies_weights)
    engine = setup.engine = build_engine(config, setup.tokenizer, model=rollout_weights)
    _check_engine(engine, bound)
    _warn_if_uncorrected(config, bound)
    if engine.updates_weights:  # tokens record policy versions from here on
        await engine.sync_weights(setup.model, setup.start_step)
    trackers = Trackers(run)
    metrics_log = MetricsLog(run.metrics_path)
    try:
        async with rollout_session(config, run=run, components=setup.components, engine=engine,
                                   tokenizer=setup.tokenizer) as session:
            if bound is not None:
                setup.pipeline = GroupPipeline(
                    session.rollout, setup.order.next_batch, batch_size=config.data.train_batch_size,
                    bound=bound, version=setup.start_step, pending=setup.pending, **_group_filter(setup, config))
                setup.update_thread = update_executor(setup.trainer, engine)
            try:
                await _run_steps(run, setup, session, metrics_log, trackers)
            finally:  # groups still rolling out end before the session stops the judge and workflow processes
                if setup.pipeline is not None:
                    await setup.pipeline.aclose()
                if setup.update_thread is not None:
                    setup.update_thread.shutdown()
    finally:
        await engine.aclose()
        trackers.close()
    _finish(run)


def update_executor(trainer: GRPOTrainer | PolicyTrainers, engine: Any) -> ThreadPoolExecutor:
    """The thread asynchronous updates run in, while the event loop serves the workflows and the engine's
    decode thread generates. On CPU, when the update spreads its micro-batches over threads of its own
    (`local.update_threads`, update_threads.py), this one only gathers them: one intra-op thread. A
    one-thread update (`update_threads: 1`) computes here, on the cores the decode thread leaves: two
    OpenMP teams as wide as the machine each wait, op after op, for threads the other preempted."""
    if trainer.device.type != "cpu":
        threads = None
    elif trainer.threads is not None:
        threads = 1
    else:
        threads = max(1, torch.get_num_threads() - (getattr(engine, "cpu_threads", None) or 0))
    return intra_op_executor("agenttune-update", threads)


def _group_filter(setup: Setup, config: Any) -> dict[str, Any]:
    """Dynamic sampling in asynchronous mode: the pipeline replaces groups without a learning signal."""
    algorithm = config.algorithm
    if not algorithm.dynamic_sampling.enable:
        return {}
    estimator, overlong = setup.trainer.estimator, algorithm.overlong_shaping
    return {"accept": lambda group: is_informative(group.episodes, estimator, overlong),
            "max_rejected": algorithm.dynamic_sampling.max_retries * config.data.train_batch_size}


def _every(frequency: int, step: int, last: bool) -> bool:
    """Every `frequency` steps and at the last one; never when `frequency` is 0."""
    return frequency > 0 and (step % frequency == 0 or last)


async def _run_steps(run: Run, setup: Setup, session: Any, metrics_log: MetricsLog, trackers: Trackers) -> None:
    config = run.config
    with TrainingProgress(setup.total_steps, start_step=setup.start_step) as progress:
        if config.trainer.val_before_train and setup.start_step == 0 and setup.validation:
            metrics = await _validate(session, setup, progress, step=0)
            _write(metrics_log, trackers, 0, {"epoch": 0, **metrics})
        for step in range(setup.start_step + 1, setup.total_steps + 1):
            last = step == setup.total_steps
            take_step = _train_step if setup.pipeline is None else _train_step_async
            metrics = await take_step(session, setup, progress, step)
            if setup.validation and _every(config.trainer.test_freq, step, last):
                metrics.update(await _validate(session, setup, progress, step=step))
            _write(metrics_log, trackers, step, metrics)
            progress.step_done(step, setup.order.epoch, metrics)
            if last or _every(config.trainer.save_freq, step, last=False):
                progress.phase("saving")
                _save(run, setup, step)


async def _train_step(session: Any, setup: Setup, progress: TrainingProgress, step: int) -> dict[str, float]:
    started, counted = time.perf_counter(), setup.engine.counters()
    async def roll_out() -> list[Episode]:
        tasks = setup.order.next_batch()
        progress.phase(f"rollout: {len(tasks)} tasks x {session.config.rollout.num_repeat}")
        return await session.rollout.run_tasks(tasks)

    episodes = trained = await roll_out()
    algorithm = session.config.algorithm
    sampling_metrics: dict[str, float] = {}
    if algorithm.dynamic_sampling.enable:
        trained, episodes, sampling_metrics = await fill_batch(
            episodes, roll_out, estimator=setup.trainer.estimator, batch_size=session.config.data.train_batch_size,
            max_retries=algorithm.dynamic_sampling.max_retries, overlong=algorithm.overlong_shaping)
    rollout_s = time.perf_counter() - started
    metrics = session.record(step, "train", episodes)
    metrics.update(sampling_metrics)
    progress.phase("training")
    await setup.engine.release_memory()  # an engine with its own weights on this GPU (vllm) sleeps
    metrics.update(setup.trainer.step(trained))
    await setup.engine.sync_weights(setup.model, step)  # vllm: wakes, loads the new weights, resets its prefix cache
    _add_perf(metrics, started, rollout_s, setup.order.epoch)
    metrics.update(engine_metrics(counted, setup.engine.counters()))
    return metrics


async def _train_step_async(session: Any, setup: Setup, progress: TrainingProgress, step: int) -> dict[str, float]:
    """Train on the first complete groups while the next ones roll out; then refresh the rollout weights."""
    started, counted = time.perf_counter(), setup.engine.counters()
    progress.phase(f"waiting for {session.config.data.train_batch_size} groups")
    groups, metrics = await setup.pipeline.next_batch()
    waited_s = time.perf_counter() - started
    episodes = [episode for group in groups for episode in group.episodes]
    metrics.update(session.record(step, "train", episodes))
    metrics.update(staleness_metrics(episodes, version=step - 1))
    progress.phase("training (rollouts go on)")
    # In a thread: the event loop keeps serving the gateway and the workflows meanwhile. No
    # release_memory: the engine goes on generating during the update (vllm does not sleep). On CPU
    # the update takes the cores of its threads only when the next batch is complete already: otherwise
    # they would starve the decode thread the next step waits for (update_threads.py).
    threads = None if setup.pipeline.ahead() else 1
    update = asyncio.get_running_loop().run_in_executor(
        setup.update_thread, functools.partial(setup.trainer.step, episodes, threads=threads))
    metrics.update(await update)
    await setup.engine.sync_weights(setup.model, step)  # lands among requests in flight (partial rollouts)
    setup.pipeline.advance(step)
    _add_perf(metrics, started, waited_s, setup.order.epoch)
    metrics.update(engine_metrics(counted, setup.engine.counters()))
    return metrics


def _add_perf(metrics: dict[str, float], started: float, rollout_s: float, epoch: int) -> None:
    """`rollout_s`: the time the step waited for its episodes (all of the rollout, when synchronous)."""
    elapsed = time.perf_counter() - started
    generated = metrics.get("tokens/generated_total", 0.0)
    metrics.update({
        "epoch": float(epoch),
        "perf/rollout_time_s": rollout_s,
        "perf/step_time_s": elapsed,
        "perf/rollout_tokens_per_s": generated / rollout_s if rollout_s else 0.0,
        "perf/tokens_per_s": (generated + metrics.get("train/tokens", 0.0)) / elapsed if elapsed else 0.0,
    })


def engine_metrics(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The engine's counters (`InferenceEngine.counters`) over one step as `engine/*` metrics, with
    the `hf` engine's rows per decode step, milliseconds per decode step, KV-cache columns per decode
    step and batch occupancy."""
    step = {name: value - before.get(name, 0.0) for name, value in after.items()}
    metrics = {f"engine/{name}": value for name, value in step.items()}
    if step.get("decode_steps"):
        metrics["engine/rows_per_decode_step"] = step["rows_decoded"] / step["decode_steps"]
        metrics["engine/decode_ms_per_step"] = 1000 * step["decode_s"] / step["decode_steps"]
        if "columns" in step:
            metrics["engine/columns_per_decode_step"] = step["columns"] / step["decode_steps"]
    if step.get("rows_in_flight"):
        metrics["engine/occupancy"] = step["rows_decoded"] / step["rows_in_flight"]
    return metrics


def rollout_model(model: torch.nn.Module, bound: int | None, *, engine_copies: bool = False) -> torch.nn.Module:
    """The model handed to the engine: the trained model itself when synchronous (nothing copied);
    when asynchronous a frozen copy, refreshed by `engine.sync_weights` after each step, unless the
    engine keeps a copy of its own (`engine_copies`: vllm only reads the trained model in
    `sync_weights`, once the step is done; a second copy on the GPU would be wasted)."""
    if bound is None or engine_copies:
        return model
    import copy

    copied = copy.deepcopy(model)
    copied.requires_grad_(False)
    return copied.eval()


def _warn_if_uncorrected(config: Any, bound: int | None) -> None:
    """Tokens sampled by older weights are trained as if on-policy unless rollout correction weighs them
    (verl, AReaL and slime all pair asynchronous training with it). Asynchronous modes turn it on by
    default (config/models.py); this warns when the user turned it off. The quickstart at max_staleness 2
    without it once peaked at 100 % held-out and fell to 56 % by step 20 (docs/local.md)."""
    correction = config.algorithm.rollout_correction
    if bound and not (correction.rollout_is or correction.rollout_rs or correction.bypass_mode):
        log.warning("asynchronous training with rollout correction turned off: tokens up to "
                    f"{bound} policy versions old are trained as if on-policy. Leave "
                    "algorithm.rollout_correction unset (asynchronous modes then use rollout_is: token, "
                    "rollout_is_threshold: 2.0) to weigh them by pi_old / pi_rollout (docs/local.md, "
                    "Asynchronous training).")


def _check_engine(engine: Any, bound: int | None) -> None:
    if bound is not None and not engine.updates_weights:
        raise UserError(f"trainer.mode asynchronous needs an engine that takes weight updates while requests are in "
                        f"flight and records each token's policy version; the {engine.name!r} engine does not.",
                        hint="Use engine.type: hf (CPU or GPU) or vllm (GPU) with trainer.mode: async or "
                             "one_step_off, or trainer.mode: sync with this engine.")


async def _validate(session: Any, setup: Setup, progress: TrainingProgress, *, step: int) -> dict[str, float]:
    from agenttune.rollout.session import VALIDATION

    progress.phase(f"validation: {len(setup.validation)} tasks")
    started = time.perf_counter()
    episodes = await session.rollout.run_tasks(
        setup.validation, num_repeat=1, sampling=sampling_params(session.config.rollout, validation=True))
    metrics = session.record(step, VALIDATION, episodes)
    metrics["perf/validation_time_s"] = time.perf_counter() - started
    progress.validation_done(metrics)
    log.info("validation", step=step, accuracy=round(metrics.get("val/success_rate", 0.0), 4),
             reward=round(metrics.get("val/reward/mean", 0.0), 4))
    return metrics


def _write(metrics_log: MetricsLog, trackers: Trackers, step: int, metrics: dict[str, float]) -> None:
    metrics_log.write(step, metrics)
    trackers.log(step, metrics)


def _save(run: Run, setup: Setup, step: int) -> None:
    config, local = run.config, local_options(run.config)
    state = checkpoints.CheckpointState(
        step=step, task_order=setup.order.state_dict(), base_model=resolve_model_path(config.model.path),
        lora=trains_adapters(config),
    )
    if config.policies.enabled:  # `agenttune export --policy NAME` finds each adapter by it
        state.extra["policies"] = list(config.policies.adapters)
    if setup.pipeline is not None:  # started or queued groups a resumed run must start again
        state.extra["pending_tasks"] = [task.model_dump(mode="json") for task in setup.pipeline.pending()]
    path = checkpoints.save_checkpoint(run.checkpoints_dir, state, model=setup.model, tokenizer=setup.tokenizer,
                                       trainer_state=setup.trainer.state_dict(), keep=local.keep_checkpoints)
    log.info("checkpoint saved", path=str(path))


def _finish(run: Run) -> None:
    from rich.console import Console

    records = MetricsLog(run.metrics_path).read()
    if not records:
        return
    console = Console()
    console.print(summary_table(records))
    if local_options(run.config).plot:
        path = plot_curves(records, run.run_dir / PLOT_NAME, title=f"{run.config.experiment_name} ({run.run_dir.name})")
        if path is not None:
            console.print(f"training curves: {path}")
