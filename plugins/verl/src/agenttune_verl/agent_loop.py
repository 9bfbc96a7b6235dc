"""The verl agent loop that runs an agenttune workflow for each dataset row.

verl's agent-loop worker creates one `AgentTuneAgentLoop` per trajectory, from the agent-loop YAML
that the launcher writes (`launch.write_agent_loop_config`):

    - name: agenttune
      _target_: agenttune_verl.agent_loop.AgentTuneAgentLoop
      agenttune_config: <run_dir>/config.yaml
      source_dir: <directory of the user's YAML>
      run_dir: <run_dir>

`run()` rebuilds the row's `Task`, runs one episode of the user's workflow through agenttune's
rollout stack (gateway + judge) whose engine generates with verl's `server_manager`, and returns the
judged episode as `AgentLoopOutput`s. The rollout stack is built once per worker process and shared
by every trajectory that worker runs.
"""

from __future__ import annotations

import asyncio
import itertools
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from agenttune.plugin_api import Episode, SamplingParams, get_logger
from agenttune_verl.dataset import task_from_row
from agenttune_verl.engine import VerlEngine
from agenttune_verl.outputs import Limits, episode_outputs
from agenttune_verl.rollout_files import LockedRolloutLog

log = get_logger("verl.agent_loop")


@dataclass(frozen=True)
class LoopSettings:
    agenttune_config: str
    source_dir: str | None = None
    run_dir: str | None = None


class AgentTuneAgentLoop(AgentLoopBase):
    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any,
                 dataset_cls: Any, data_config: Any, *, agenttune_config: str, source_dir: str | None = None,
                 run_dir: str | None = None, **kwargs: Any):
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, **kwargs)
        self.settings = LoopSettings(str(agenttune_config), source_dir and str(source_dir),
                                     run_dir and str(run_dir))

    async def run(self, sampling_params: dict[str, Any],
                  **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        runtime = await WorkerRuntime.get(self.settings, self.server_manager, self.tokenizer)
        limits = Limits(self.rollout_config.prompt_length, self.rollout_config.response_length)
        outputs = await runtime.run_row(sampling_params, kwargs, limits=limits,
                                        keep_all_samples=bool(self.config.trainer.get("use_v1", True)))
        # [] (a dropped failed episode): verl's V1 worker stores nothing for this session
        return outputs if len(outputs) != 1 else outputs[0]


class WorkerRuntime:
    """One per worker process (and event loop): the agenttune rollout stack behind verl's servers."""

    _runtimes: dict[tuple[LoopSettings, int], WorkerRuntime] = {}
    _creating: dict[int, asyncio.Lock] = {}  # per event loop: a lock belongs to one loop

    def __init__(self, settings: LoopSettings, server_manager: Any, tokenizer: Any):
        self.settings = settings
        self.engine = VerlEngine(server_manager)
        self.tokenizer = tokenizer
        self.stack = AsyncExitStack()
        self.session: Any = None
        self.config: Any = None
        self.slots: asyncio.Semaphore | None = None
        self.rollout_log = LockedRolloutLog(Path(settings.run_dir) / "rollouts") if settings.run_dir else None
        self._repeats: dict[str, itertools.count] = {}

    @classmethod
    async def get(cls, settings: LoopSettings, server_manager: Any, tokenizer: Any) -> WorkerRuntime:
        loop_id = id(asyncio.get_running_loop())
        key = (settings, loop_id)
        async with cls._creating.setdefault(loop_id, asyncio.Lock()):
            runtime = cls._runtimes.get(key)
            if runtime is None:
                runtime = cls(settings, server_manager, tokenizer)
                await runtime.start()
                cls._runtimes[key] = runtime
        runtime.engine.server_manager = server_manager  # the same client for every loop of a worker
        return runtime

    @classmethod
    async def close_all(cls) -> None:
        """Tear down the runtimes of the running event loop (tests; worker processes just exit)."""
        loop_id = id(asyncio.get_running_loop())
        for key in [key for key in cls._runtimes if key[1] == loop_id]:
            await cls._runtimes.pop(key).stack.aclose()
        cls._creating.pop(loop_id, None)

    async def start(self) -> None:
        from agenttune.plugin_api import load_config, rollout_session

        self.config = load_config(self.settings.agenttune_config)
        if self.settings.source_dir:
            self.config._source_dir = Path(self.settings.source_dir)  # where the user's workflow module lives
        self.slots = asyncio.Semaphore(self.config.rollout.max_env_worker)
        self.session = await self.stack.enter_async_context(
            rollout_session(self.config, engine=self.engine, tokenizer=self.tokenizer))

    async def run_row(self, sampling_params: dict[str, Any], row: dict[str, Any], *, limits: Limits,
                      keep_all_samples: bool) -> list[AgentLoopOutput]:
        extra_info = dict(row.get("extra_info") or {})
        task = task_from_row(extra_info)
        group_id = str(row.get("uid", f"row-{row.get('index', task.task_id)}"))
        repeat_index = int(row["session_id"]) if "session_id" in row else next(
            self._repeats.setdefault(group_id, itertools.count()))
        assert self.slots is not None
        async with self.slots:
            episode = await self.session.rollout.run_episode(
                task, self.sampling(sampling_params), group_id=group_id, repeat_index=repeat_index)
        stats = self.engine.stats(episode.episode_id)
        self.engine.forget(episode.episode_id)
        step = int(row.get("global_steps", 0))
        split = str(extra_info.get("split", "train"))
        # Only the V1 trainer takes an empty answer; validation must count every failure against accuracy.
        can_drop = keep_all_samples and split == "train"
        outputs = episode_outputs(episode, limits, stats=stats, task_prompt=lambda: self._prompt_ids(row),
                                  pad_token_id=self._pad_token_id(), keep_all_samples=keep_all_samples, step=step,
                                  can_drop=can_drop,
                                  overlong=self.config.algorithm.overlong_shaping if split == "train" else None)
        if not outputs:
            log.info("failed episode dropped from training", episode=episode.episode_id, status=episode.status.value)
        self._log(episode, step=step, split=split)
        return outputs

    def sampling(self, verl_sampling: dict[str, Any]) -> SamplingParams:
        """verl decides temperature/top_p/top_k (training vs validation); agenttune the per-call length."""
        return SamplingParams(
            temperature=float(verl_sampling.get("temperature", self.config.rollout.temperature)),
            top_p=float(verl_sampling.get("top_p", self.config.rollout.top_p)),
            top_k=int(verl_sampling.get("top_k", self.config.rollout.top_k)),
            max_tokens=self.config.rollout.max_response_length_in_one_turn,
        )

    def _prompt_ids(self, row: dict[str, Any]) -> list[int]:
        messages = list(row.get("raw_prompt") or [])
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception:  # only a placeholder's context: an odd prompt must not fail the row
            return []
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return [int(token) for token in ids]

    def _pad_token_id(self) -> int:
        for token_id in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if token_id is not None:
                return int(token_id)
        return 0

    def _log(self, episode: Episode, *, step: int, split: str) -> None:
        if self.rollout_log is None:
            return
        try:
            self.rollout_log.write(step, split, [episode], self.tokenizer)
        except Exception as error:  # the log must never cost a trajectory
            log.warning("writing the rollout log failed", error=f"{type(error).__name__}: {error}")
