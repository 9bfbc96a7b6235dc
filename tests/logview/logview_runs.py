"""Runs for the log viewer's tests, written the way backbones write them.

Episodes carry real token ids of the tiny model's tokenizer (a chat prompt, a generated tool call,
the tool result the gateway inserted, a generated answer); the rollout log is written by the real
`RolloutLog` writer and metrics by `MetricsLog`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from agenttune.rollout.log import RolloutLog
from agenttune.rollout.metrics import MetricsLog, step_metrics
from agenttune.testing import tiny_tokenizer
from agenttune.workflow.episode import Episode, EpisodeStatus, Sample
from agenttune.workflow.task import Task

SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '<img src=x onerror="window.__pwned = 2">'
SYSTEM = "Solve the arithmetic problem. You may use the calculator."


def encode(text: str) -> list[int]:
    return tiny_tokenizer().encode(text, add_special_tokens=False)


def logprob(step: int, number: int, position: int) -> float:
    """A distinct, known logprob for every generated token (the browser test looks for it)."""
    return -round(0.01 + ((step * 7 + number * 13 + position * 3) % 97) / 50, 4)


def episode(step: int, number: int, *, status: EpisodeStatus = EpisodeStatus.OK, answer: str | None = None) -> Episode:
    """Episode `number` of a step: `x * 7 + 3`, a calculator call, an answer (right for even numbers)."""
    result = number * 7 + 3
    answer = answer if answer is not None else f"The answer is {result if number % 2 == 0 else result + 1}."
    arguments = f'{{"expression": "{number}*7+3"}}'
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {number} * 7 + 3?"},
        {"role": "assistant", "content": "", "reasoning_content": "Use the calculator.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "calculator", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": str(result)},
        {"role": "assistant", "content": answer},
    ]
    tokenizer = tiny_tokenizer()
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=True, add_generation_prompt=True)
    prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
    call = encode(f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>')
    glue = encode(f"\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    reply = encode(answer)
    eos = [tokenizer.eos_token_id]
    response = call + eos + glue + reply + eos
    mask = [1] * (len(call) + 1) + [0] * len(glue) + [1] * (len(reply) + 1)
    # As in asynchronous training: the weights were updated between the two calls (a partial rollout).
    versions = [step - 1] * (len(call) + 1) + [-1] * len(glue) + [step] * (len(reply) + 1)
    sample = Sample(prompt_ids=prompt, response_ids=response, loss_mask=mask, num_calls=2,
                    logprobs=[logprob(step, number, i) if m else 0.0 for i, m in enumerate(mask)],
                    policy_versions=versions)
    failed = status.failed
    reward = 0.0 if failed else float(number % 2 == 0)
    return Episode(
        episode_id=f"step{step}-episode{number}", task=Task(task_id=f"arith-{number // 2}", query=messages[1]["content"],
                                                            metadata={"ground_truth": result}),
        group_id=f"group-{number // 2}", repeat_index=number % 2, status=status,
        error="TimeoutError: the episode ran past 120 s" if status is EpisodeStatus.TIMEOUT else None,
        reward=reward, success=reward > 0, samples=[sample], messages=messages,
        metrics={"calls": 2.0, "prompt_tokens": float(len(prompt)), "generated_tokens": float(sum(mask))},
        duration_s=0.5 + number / 10,
    )


def step_episodes(step: int, count: int = 6) -> list[Episode]:
    """`count` episodes; number 3 timed out, number 5's answer contains markup that must stay text."""
    episodes = []
    for number in range(count):
        if number == 3:
            episodes.append(episode(step, number, status=EpisodeStatus.TIMEOUT))
        elif number == 5:
            episodes.append(episode(step, number, answer=f"Look: {SCRIPT} {IMG}"))
        else:
            episodes.append(episode(step, number))
    return episodes


def write_run(run_dir: Path, steps: int = 2, *, count: int = 6, validation: bool = True) -> Path:
    """A run directory: `steps` train steps (and validation at each) with metrics.jsonl."""
    for step in range(1, steps + 1):
        write_step(run_dir, step, count=count, validation=validation)
    return run_dir


def write_step(run_dir: Path, step: int, *, count: int = 6, validation: bool = True) -> None:
    log = RolloutLog(run_dir / "rollouts")
    train = step_episodes(step, count)
    log.write(step, "train", train, tiny_tokenizer())
    values = step_metrics(train)
    if validation:
        held_out = [episode(step, number) for number in range(2)]
        log.write(step, "validation", held_out, tiny_tokenizer())
        values |= step_metrics(held_out, prefix="val/")
    MetricsLog(run_dir / "metrics.jsonl").write(step, values)


@contextmanager
def viewer(root: Path, limits: Any = None) -> Iterator[tuple[str, httpx.Client]]:
    """A real viewer over `root` on a free loopback port, and an HTTP client for it."""
    from agenttune.logview.server import start_in_background

    running = start_in_background(root, port=0, limits=limits)
    try:
        with httpx.Client(base_url=running.url, timeout=10) as client:
            yield running.url, client
    finally:
        running.stop()
