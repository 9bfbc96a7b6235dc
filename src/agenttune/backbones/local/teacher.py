"""The on-policy distillation teacher: its log-prob of every token of a step's micro-batches.

`teacher_engine: hf` loads the teacher beside the student and scores the same packed batches at the
same temperature. The other two score each row's token ids, prompt and response, as one prompt
with an engine's `prompt_logprobs`, at temperature 1 (the teacher's own distribution):
`teacher_engine: vllm` with an in-process vLLM engine of its own (components/engines/vllm.py's `scorer`, asleep
between steps at sleep_level 1), `teacher_engine: openai` with an OpenAI-compatible server that
returns prompt log-probs (`vllm serve TEACHER`, `agenttune serve --model TEACHER`).

Such an engine lives for the whole run on an event loop of its own thread: the trainer's step is
synchronous (and runs on the rollout's loop, or in a worker thread in asynchronous modes), and an
HTTP client or a vLLM engine belongs to the loop that first used it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

import torch

from agenttune.backbones.local.logprobs import Batch, token_logprobs
from agenttune.components.engines.base import InferenceEngine
from agenttune.config.models import AgentTuneConfig
from agenttune.config.run import get_logger
from agenttune.errors import UserError

log = get_logger("local")

SERVER_CONCURRENCY = 16  # rows scored at once by a teacher server (vLLM in-process takes them all: it batches)
Result = TypeVar("Result")


class Teacher(Protocol):
    def score(self, batches: list[Batch]) -> list[torch.Tensor]:
        """Per batch [rows, T-1], aligned with `batch.targets`: column t is the teacher's log-prob of input
        token t+1."""
        ...

    def close(self) -> None:
        """Release the teacher's engine (the end of the run)."""
        ...


class LocalTeacher:
    def __init__(self, model: torch.nn.Module, temperature: float):
        self.model, self.temperature = model, temperature

    @torch.no_grad()
    def score(self, batches: list[Batch]) -> list[torch.Tensor]:
        return [token_logprobs(self.model, batch, temperature=self.temperature)[0] for batch in batches]

    def close(self) -> None:
        """The model goes with the trainer."""


class EngineTeacher:
    """A teacher engine that scores prompts (`scores_prompts`), driven from the trainer's thread.

    `failure` says what to check when scoring fails; `concurrency` bounds the rows in flight (None:
    all of a step's rows at once). After each step's scoring the engine releases its memory (a
    vLLM teacher sleeps through the update and the rollouts; a server's engine holds none).
    """

    def __init__(self, engine: InferenceEngine, *, failure: str, hint: str, concurrency: int | None = None):
        self.engine, self.failure, self.hint = engine, failure, hint
        self.concurrency = concurrency
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="distillation-teacher", daemon=True)
        self._thread.start()
        self._run(engine.release_memory())  # room on the GPU for the student's engine, which starts next

    def score(self, batches: list[Batch]) -> list[torch.Tensor]:
        rows = [[ids[mask.bool()].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)]
                for batch in batches]
        scores = self._run(self._score([row for batch in rows for row in batch]))
        results, start = [], 0
        for batch, batch_rows in zip(batches, rows, strict=True):
            result = torch.zeros(batch.targets.shape, dtype=torch.float32)
            for row, values in enumerate(scores[start:start + len(batch_rows)]):
                result[row, :len(values)] = torch.tensor(values, dtype=torch.float32)
            results.append(result.to(batch.targets.device))
            start += len(batch_rows)
        return results

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.engine.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def _run(self, coroutine: Coroutine[Any, Any, Result]) -> Result:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _score(self, rows: list[list[int]]) -> list[list[float]]:
        limit = asyncio.Semaphore(self.concurrency or max(len(rows), 1))

        async def score(ids: list[int]) -> list[float]:
            async with limit:
                return await self.engine.prompt_logprobs(ids)

        try:
            return list(await asyncio.gather(*(score(ids) for ids in rows)))
        except UserError:
            raise
        except Exception as error:  # unreachable, refused, a 4xx for a field it does not know, vLLM refusing
            raise UserError(f"{self.failure}: {type(error).__name__}: {error}", hint=self.hint) from error
        finally:
            await self.engine.release_memory()


def load_teacher(options: Any, config: AgentTuneConfig, student: torch.nn.Module) -> Teacher:
    """The teacher the distillation loss's options name; an `hf` one frozen on the student's device."""
    if options.teacher_engine == "hf":
        return LocalTeacher(_local_model(options.teacher, config, student), config.rollout.temperature)
    if config.rollout.temperature != 1.0:
        log.warning(f"a {options.teacher_engine} teacher scores at temperature 1 while the student samples at "
                    f"rollout.temperature {config.rollout.temperature}: the reverse KL compares the two")
    if options.teacher_engine == "vllm":
        return _vllm_teacher(options, config, student)
    from agenttune.components.engines.openai import OpenAIEngine, OpenAIEngineOptions

    served = OpenAIEngineOptions(base_url=options.teacher_base_url, api_key=options.teacher_api_key,
                                 model=options.teacher)
    log.info("distillation teacher server", base_url=options.teacher_base_url, teacher=options.teacher)
    return EngineTeacher(
        OpenAIEngine(served, options.teacher), concurrency=SERVER_CONCURRENCY,
        failure=f"The distillation teacher server at {options.teacher_base_url} could not score the student's tokens",
        hint="Check that it runs (`vllm serve TEACHER` or `agenttune serve --model TEACHER`), that "
             "algorithm.policy_loss_options.teacher is its model name, and that it answers /v1/completions with "
             "`prompt_logprobs` or `echo`.")


def _vllm_teacher(options: Any, config: AgentTuneConfig, student: torch.nn.Module) -> Teacher:
    """The teacher in a vLLM engine of its own (`teacher_engine_options`: the `vllm` engine's options)."""
    from pydantic import ValidationError

    from agenttune.components.engines.model_loading import resolve_model_path
    from agenttune.components.engines.vllm import VLLMEngine, VLLMOptions

    try:  # sleep_level 1 unless set: weights kept in CPU memory between steps (2 would discard them)
        engine_options = VLLMOptions.model_validate({"sleep_level": 1, **options.teacher_engine_options})
    except ValidationError as error:
        raise UserError(f"algorithm.policy_loss_options.teacher_engine_options is not valid for a vLLM teacher: "
                        f"{error}", hint="It takes the `vllm` engine's options (docs/config.md, engine: vllm).") from error
    path = resolve_model_path(options.teacher, key="algorithm.policy_loss_options.teacher")
    _check_vocabulary(options.teacher, _config_vocabulary(path, config), config, student)
    log.info("distillation teacher (vLLM) starting", teacher=options.teacher, **engine_options.model_dump())
    return EngineTeacher(VLLMEngine.scorer(config, engine_options, path),
                         failure=f"The vLLM distillation teacher {options.teacher!r} could not score the student's "
                                 "tokens",
                         hint="Check the teacher's vLLM log above; teacher_engine_options.gpu_memory_utilization "
                              "must leave the student and its trainer room on the GPU.")


def _config_vocabulary(path: str, config: AgentTuneConfig) -> int:
    """The teacher's vocabulary size from its config.json alone (no weights are read)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(path, trust_remote_code=config.model.trust_remote_code)
               .get_text_config().vocab_size)


def _local_model(path: str, config: AgentTuneConfig, student: torch.nn.Module) -> torch.nn.Module:
    """The teacher model, frozen, on the student's device; it must read the student's token ids."""
    from agenttune.backbones.local.policy import load_pretrained
    from agenttune.components.engines.model_loading import resolve_model_path

    teacher = load_pretrained(resolve_model_path(path), config, next(student.parameters()).device)
    _check_vocabulary(path, _vocabulary(teacher), config, student)
    log.info("distillation teacher loaded", teacher=path)
    teacher.requires_grad_(False)
    return teacher.eval()


def _vocabulary(model: torch.nn.Module) -> int:
    return int(model.get_input_embeddings().num_embeddings)  # type: ignore[operator]


def _check_vocabulary(path: str, size: int, config: AgentTuneConfig, student: torch.nn.Module) -> None:
    own = _vocabulary(student)
    if size != own:
        raise UserError(f"The distillation teacher {path!r} has a vocabulary of {size} tokens, the student "
                        f"({config.model.path!r}) one of {own}: the teacher must score the student's token ids.",
                        hint="Distil from a teacher of the same model family (the same tokenizer).")
