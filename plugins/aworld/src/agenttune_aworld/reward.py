"""The `reward_function` judge: AWorld Train's (and verl's) reward functions, as an agenttune judge.

    judge:
      type: reward_function
      function: my_rewards:gaia_reward_func        # or path/to/gaia_reward.py:gaia_reward_func

The function is called as `function(data_source, solution_str, ground_truth, extra_info)`:

    data_source    the task's `data_source` column ("" when it has none)
    solution_str   the workflow's final answer (`final_answer`), else the last assistant message
    ground_truth   the task's ground truth (or `reward_model.ground_truth`, as verl datasets store it)
    extra_info     the task's `extra_info` column (a dict), plus `task_id`, `query` and `messages`
                   (the episode's conversation)

It returns a number (the reward), or a dict with `score` (the reward) and other values, which are
logged as the judge's details; `acc` or `success`, when present, say whether the task was solved
(otherwise: reward > 0). Plain and async functions both work.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agenttune.plugin_api import Judge, JudgeInput, JudgeResult, UserError, load_reference

SIGNATURE = "(data_source, solution_str, ground_truth, extra_info)"


class RewardFunctionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    function: str = Field(
        description="The reward function " + SIGNATURE + ": 'package.module:name', or 'path/to/file.py:name' "
        "('path/to/file.py' alone: the function named like the file, as AWorld Train reads it)."
    )

    @field_validator("function")
    @classmethod
    def _loads(cls, spec: str) -> str:
        load_reward_function(spec)  # when the config is checked, before any rollout
        return spec


class RewardFunctionJudge(Judge):
    """Scores an episode with a reward function of AWorld Train's signature."""

    name: ClassVar[str] = "reward_function"
    Options: ClassVar[type[BaseModel]] = RewardFunctionOptions
    options: RewardFunctionOptions

    def __init__(self, options: RewardFunctionOptions | None = None):
        super().__init__(options)
        self.function = load_reward_function(self.options.function)

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        value = self.function(*reward_arguments(judge_input))
        if inspect.isawaitable(value):  # plain judges run in a thread of their own: no loop is running here
            value = asyncio.run(_awaited(value))
        return judge_result(value, self.options.function)


def reward_arguments(judge_input: JudgeInput) -> tuple[str, str, Any, dict[str, Any]]:
    task = judge_input.task
    metadata = task.metadata
    answer = judge_input.final_answer
    solution = judge_input.last_assistant_text if answer is None else str(answer)
    ground_truth = task.ground_truth
    reward_model = metadata.get("reward_model")
    if ground_truth is None and isinstance(reward_model, dict):
        ground_truth = reward_model.get("ground_truth")
    extra = metadata.get("extra_info")
    extra_info = {**(extra if isinstance(extra, dict) else {}), "task_id": task.task_id, "query": task.query,
                  "messages": judge_input.messages}
    return str(metadata.get("data_source") or ""), solution, ground_truth, extra_info


def judge_result(value: Any, where: str) -> JudgeResult:
    details: dict[str, Any] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"the reward function {where} returned a dict without 'score': {value!r}")
        details = {key: item for key, item in value.items() if key != "score"}
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"the reward function {where} returned {value!r}; return a finite number "
                         "(or a dict with 'score')")
    solved = details.get("acc", details.get("success"))
    success = bool(solved) if solved is not None else value > 0
    return JudgeResult(reward=float(value), success=success, details=details)


def load_reward_function(spec: str) -> Callable[..., Any]:
    """The function `spec` names, checked to take AWorld Train's four arguments."""
    function = _load(spec)
    if not callable(function):
        raise UserError(f"judge.function: {spec!r} is a {type(function).__name__}, not a function.",
                        hint=f"Point it at a function {SIGNATURE}.")
    check_signature(function, spec)
    return function


def check_signature(function: Callable[..., Any], where: str) -> None:
    try:
        inspect.signature(function).bind("", "", None, {})
    except TypeError as error:
        raise UserError(f"The reward function {where} cannot be called as {SIGNATURE} ({error}).",
                        hint="Give it exactly those four parameters, as AWorld Train and verl reward functions have.") from error
    except ValueError:  # no signature to inspect (a builtin): it will tell when called
        pass


def _load(spec: str) -> Any:
    file, separator, name = spec.partition(".py:")
    if separator:
        return _from_file(Path(file + ".py"), name, spec)
    if spec.endswith(".py"):
        return _from_file(Path(spec), Path(spec).stem, spec)
    return load_reference(spec, key="judge.function")  # a clear error for what is neither path nor reference


def _from_file(path: Path, name: str, spec: str) -> Any:
    if not path.is_file():
        raise UserError(f"judge.function: {str(path)!r} does not exist.",
                        hint="Relative paths start at the current directory.")
    module_spec = importlib.util.spec_from_file_location(f"agenttune_reward_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:  # not a file Python can import (e.g. no .py)
        raise UserError(f"judge.function: {str(path)!r} is not a Python module.",
                        hint="Point it at a .py file ('path/to/file.py:name') or a module ('package.module:name').")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise UserError(f"judge.function: running {str(path)!r} raised {type(error).__name__}: {error}.",
                        hint="Fix the error in that file.") from error
    if not hasattr(module, name):
        raise UserError(f"judge.function: {str(path)!r} defines no {name!r} (from {spec!r}).",
                        hint="Name the function after the colon: path/to/file.py:function_name.")
    return getattr(module, name)


async def _awaited(value: Any) -> Any:
    return await value
