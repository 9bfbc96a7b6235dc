"""A verifiers 0.1-0.3 environment's rows as agenttune Tasks: `dataset` for train, `eval_dataset` otherwise.

Each Task carries the environment's spec and its row (prompt, answer, info, example_id) in
metadata["verifiers"], so the workflow and the judge rebuild the same environment in any process.
"""

from __future__ import annotations

from typing import Any

from agenttune.plugin_api import Task, UserError
from agenttune_verifiers.legacy.loading import load_legacy_env
from agenttune_verifiers.options import METADATA_KEY, VerifiersOptions

# Keys of task_reader that only verifiers 0.4's Env understands.
V1_ONLY = ("env_id", "harness", "agent", "env")


def legacy_spec(options: VerifiersOptions, split: str) -> dict[str, Any]:
    """What identifies the environment of one split: its id, load_environment arguments and limits."""
    used = [key for key in V1_ONLY if key in options.model_fields_set]
    if used:
        raise UserError(f"task_reader.{used[0]} is a verifiers 0.4 setting; this Python has verifiers 0.1-0.3.",
                        hint="For a 0.1-0.3 environment set id, args, split_args, limit, max_turns and "
                             "rollout_timeout only (docs/verifiers.md).")
    return {"id": options.id, "args": {**options.args, **options.split_args.get(split, {})},
            "max_turns": options.max_turns, "timeout": options.rollout_timeout}


def read_legacy_tasks(options: VerifiersOptions, split: str) -> list[Task]:
    spec = legacy_spec(options, split)
    env = load_legacy_env(spec)
    count = options.limit or -1
    if split == "train":
        rows = env.get_dataset(n=count) if env.dataset_source is not None else env.get_eval_dataset(n=count)
    else:
        rows = env.get_eval_dataset(n=count)  # verifiers falls back to the train rows when it has no eval set
    return [_to_task(dict(row), spec, split) for row in rows]


def _to_task(row: dict[str, Any], spec: dict[str, Any], split: str) -> Task:
    return Task(task_id=f"{split}-{row.get('example_id', '')}", query=_last_user_text(row.get("prompt")),
                metadata={METADATA_KEY: {"stack": "legacy", "env": spec, "row": row}})


def _last_user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt or []):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    return ""
