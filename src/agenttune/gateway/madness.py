"""Madness checks (`rollout.compute_madness_checklist`): replies that should not be rewarded.

* `nonsense`: a special token (other than the final stop token) leaked into the reply, or the reply
  degenerated into a loop: a span of at least `MIN_LOOP_TOKENS` tokens made of one short pattern
  (at most `MAX_PERIOD` tokens) repeated at least `MIN_REPEATS` times.
* `wrong_toolcall`: a tool call that cannot be read (bad JSON, no name), names a tool the request did
  not offer, or tool-call markup when no tools were offered.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet

MIN_LOOP_TOKENS = 48
MAX_PERIOD = 32
MIN_REPEATS = 3

NONSENSE = "nonsense"
WRONG_TOOLCALL = "wrong_toolcall"


def leaked_special_token(text_ids: list[int], special_ids: AbstractSet[int]) -> bool:
    """A special token in the reply's text (`text_ids`: the reply without its final stop token)."""
    return not special_ids.isdisjoint(text_ids)


def repetition_loop(token_ids: list[int]) -> bool:
    """Whether some stretch of the reply is one short pattern repeated over and over."""
    if len(token_ids) < MIN_LOOP_TOKENS:
        return False
    import numpy as np

    ids = np.asarray(token_ids)
    for period in range(1, MAX_PERIOD + 1):
        if len(ids) <= period:
            break
        same = ids[period:] == ids[:-period]  # position i repeats the token one period earlier
        run = _longest_true_run(same)
        span = run + period
        if span >= MIN_LOOP_TOKENS and span >= MIN_REPEATS * period:
            return True
    return False


def _longest_true_run(flags) -> int:
    import numpy as np

    if not flags.any():
        return 0
    padded = np.concatenate(([0], flags.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(padded))
    return int((edges[1::2] - edges[::2]).max())


def wrong_tool_calls(calls: Iterable[dict], errors: list[str], offered: set[str], markup_without_tools: bool) -> list[str]:
    """Why the reply's tool calls are wrong (empty: nothing wrong)."""
    problems = list(errors)
    problems += [f"unknown tool {call['function']['name']!r}" for call in calls
                 if offered and call["function"]["name"] not in offered]
    if markup_without_tools:
        problems.append("tool-call markup but the request offered no tools")
    return problems
