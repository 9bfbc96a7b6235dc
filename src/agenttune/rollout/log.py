"""The rollout log: every episode of every step, token by token, as JSON lines.

Layout: `<run_dir>/rollouts/step_{step:06d}_{split}.jsonl`, one `RolloutRecord` per line. A record is
an `Episode` plus the step, the split and each sample's tokens as text, so the log viewer can draw
trained tokens (loss mask 1) and context tokens without loading a tokenizer. docs/rollouts.md
describes the schema; change it only by adding fields with defaults (bump `schema_version` when
a reader must tell versions apart).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field

from agenttune.workflow.episode import Episode, Sample

SCHEMA_VERSION = 1


class Decoder(Protocol):
    """What the log needs from a tokenizer (a Hugging Face tokenizer has it)."""

    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


class LoggedSample(Sample):
    """A sample with the text of each token, aligned with its ids."""

    prompt_tokens: list[str] = Field(default_factory=list, description="Text of each prompt token.")
    response_tokens: list[str] = Field(default_factory=list, description="Text of each response token.")

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        for ids, tokens, name in ((self.prompt_ids, self.prompt_tokens, "prompt"),
                                  (self.response_ids, self.response_tokens, "response")):
            if tokens and len(tokens) != len(ids):
                raise ValueError(f"{name}_tokens has {len(tokens)} entries for {len(ids)} ids")


class RolloutRecord(Episode):
    """One line of the rollout log."""

    schema_version: int = SCHEMA_VERSION
    step: int = Field(description="The training step the episode was rolled out for (0: before training).")
    split: str = Field(description="'train' or 'validation'.")
    samples: list[LoggedSample] = Field(default_factory=list)  # type: ignore[assignment]
    # Last in the line, so the log viewer's index reads it without parsing the samples (logview/step_index.py).
    policies: list[str] = Field(default_factory=list, description="The policies that sampled this episode's "
                                                                  "samples (each sample's `policy`), sorted.")


class TokenText:
    """Decodes token ids one by one, remembering each id's text (vocabularies repeat a lot)."""

    def __init__(self, tokenizer: Decoder):
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_ids: Iterable[int]) -> list[str]:
        return [self._one(token_id) for token_id in token_ids]

    def _one(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            # Special tokens (<|im_start|>, <tool_call>) are shown as themselves: the viewer needs them.
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self.cache[token_id] = text
        return text


def to_record(episode: Episode, *, step: int, split: str, token_text: TokenText | None) -> RolloutRecord:
    samples = [
        LoggedSample(
            # a record read back from a log carries token text already: take the plain Sample fields
            **sample.model_dump(include=set(Sample.model_fields)),
            prompt_tokens=token_text(sample.prompt_ids) if token_text else [],
            response_tokens=token_text(sample.response_ids) if token_text else [],
        )
        for sample in episode.samples
    ]
    fields = episode.model_dump(include=set(Episode.model_fields) - {"samples"})
    policies = sorted({sample.policy for sample in samples if sample.policy is not None})
    return RolloutRecord(**fields, samples=samples, step=step, split=split, policies=policies)


class RolloutLog:
    """Writes and reads `<run_dir>/rollouts/`. Every backbone writes through it."""

    def __init__(self, rollouts_dir: Path):
        self.dir = Path(rollouts_dir)

    @classmethod
    def for_run(cls, run: Any) -> RolloutLog:
        """The log of a `Run` (anything with `rollouts_dir`)."""
        return cls(run.rollouts_dir)

    def path(self, step: int, split: str) -> Path:
        return self.dir / f"step_{step:06d}_{split}.jsonl"

    def write(self, step: int, split: str, episodes: Sequence[Episode], tokenizer: Decoder | None) -> Path:
        """Append the episodes of one step; `tokenizer=None` logs ids without token text."""
        token_text = TokenText(tokenizer) if tokenizer is not None else None
        path = self.path(step, split)
        self.dir.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as file:
            for episode in episodes:
                record = to_record(episode, step=step, split=split, token_text=token_text)
                file.write(record.model_dump_json() + "\n")
        return path

    def replace(self, step: int, split: str, episodes: Sequence[Episode], tokenizer: Decoder | None) -> Path:
        """Write the step's file anew with these episodes, atomically (readers see the old or the new)."""
        path = self.path(step, split)
        staged = RolloutLog(self.dir / ".staging")
        staged_path = staged.path(step, split)
        staged_path.unlink(missing_ok=True)
        staged.write(step, split, episodes, tokenizer)
        staged_path.replace(path)
        return path

    def files(self) -> list[Path]:
        """The log files, by step then split."""
        return sorted(self.dir.glob("step_*.jsonl")) if self.dir.exists() else []


def read_records(path: Path) -> Iterator[RolloutRecord]:
    """The records of one log file, validated."""
    with Path(path).open(encoding="utf-8") as file:
        for line in file:
            if line.strip():
                yield RolloutRecord.model_validate_json(line)
