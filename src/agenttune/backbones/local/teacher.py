"""The on-policy distillation teacher: its log-prob of every token of a micro-batch.

`teacher_engine: hf` loads the teacher beside the student and scores the same packed batches at the
same temperature. `teacher_engine: openai` asks an OpenAI-compatible server that returns prompt
log-probs (`vllm serve TEACHER`, `agenttune serve --model TEACHER`) to score each row's token ids,
prompt and response, as one prompt (engines/openai.py's `prompt_logprobs`); a server scores at
temperature 1, its own distribution.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import torch

from agenttune.backbones.local.logprobs import Batch, token_logprobs
from agenttune.config import AgentTuneConfig
from agenttune.errors import UserError
from agenttune.run import get_logger

log = get_logger("local")

SERVER_CONCURRENCY = 16  # rows scored at once by a teacher server


class Teacher(Protocol):
    def logprobs(self, batch: Batch) -> torch.Tensor:
        """[rows, T-1], aligned with `batch.targets`: column t is the teacher's log-prob of input token t+1."""
        ...


class LocalTeacher:
    def __init__(self, model: torch.nn.Module, temperature: float):
        self.model, self.temperature = model, temperature

    @torch.no_grad()
    def logprobs(self, batch: Batch) -> torch.Tensor:
        return token_logprobs(self.model, batch, temperature=self.temperature)[0]


class ServedTeacher:
    def __init__(self, base_url: str, api_key: str, model: str):
        from agenttune.engines.openai import OpenAIEngineOptions

        self.options = OpenAIEngineOptions(base_url=base_url, api_key=api_key, model=model)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)]
        with ThreadPoolExecutor(1) as thread:  # its own event loop: the trainer may run on the rollout's
            scores = thread.submit(asyncio.run, self._score(rows)).result()
        result = torch.zeros(batch.targets.shape, dtype=torch.float32)
        for row, values in enumerate(scores):
            result[row, :len(values)] = torch.tensor(values, dtype=torch.float32)
        return result.to(batch.targets.device)

    async def _score(self, rows: list[list[int]]) -> list[list[float]]:
        from agenttune.engines.openai import OpenAIEngine

        engine = OpenAIEngine(self.options, self.options.model or "")
        limit = asyncio.Semaphore(SERVER_CONCURRENCY)

        async def score(ids: list[int]) -> list[float]:
            async with limit:
                return await engine.prompt_logprobs(ids)

        try:
            return list(await asyncio.gather(*(score(ids) for ids in rows)))
        except UserError:
            raise
        except Exception as error:  # unreachable, refused, a 4xx for a field it does not know
            raise UserError(f"The distillation teacher server at {self.options.base_url} could not score the "
                            f"student's tokens: {type(error).__name__}: {error}",
                            hint="Check that it runs (`vllm serve TEACHER` or `agenttune serve --model TEACHER`), "
                                 "that algorithm.policy_loss_options.teacher is its model name, and that it "
                                 "answers /v1/completions with `prompt_logprobs` or `echo`.") from error
        finally:
            await engine.aclose()


def load_teacher(options: Any, config: AgentTuneConfig, student: torch.nn.Module) -> Teacher:
    """The teacher the distillation loss's options name; an `hf` one frozen on the student's device."""
    if options.teacher_engine == "openai":
        if config.rollout.temperature != 1.0:
            log.warning("a teacher server scores at temperature 1 while the student samples at "
                        f"rollout.temperature {config.rollout.temperature}: the reverse KL compares the two")
        log.info("distillation teacher server", base_url=options.teacher_base_url, teacher=options.teacher)
        return ServedTeacher(options.teacher_base_url, options.teacher_api_key, options.teacher)
    return LocalTeacher(_local_model(options.teacher, config, student), config.rollout.temperature)


def _local_model(path: str, config: AgentTuneConfig, student: torch.nn.Module) -> torch.nn.Module:
    """The teacher model, frozen, on the student's device; it must read the student's token ids."""
    from agenttune.backbones.local.policy import load_pretrained
    from agenttune.model_loading import resolve_model_path

    teacher = load_pretrained(resolve_model_path(path), config, next(student.parameters()).device)
    sizes = [model.get_input_embeddings().num_embeddings for model in (teacher, student)]  # type: ignore[operator]
    if sizes[0] != sizes[1]:
        raise UserError(f"The distillation teacher {path!r} has a vocabulary of {sizes[0]} tokens, the student "
                        f"({config.model.path!r}) one of {sizes[1]}: the teacher must score the student's token ids.",
                        hint="Distil from a teacher of the same model family (the same tokenizer).")
    log.info("distillation teacher loaded", teacher=path)
    teacher.requires_grad_(False)
    return teacher.eval()
