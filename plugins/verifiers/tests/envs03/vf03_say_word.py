"""A verifiers 0.1-0.3 single-turn environment written for the tests: say the word back.

Its rubric: an exact-match reward (weight 1), a length metric (weight 0) and a group-level reward
function (plural parameters; weight 0.5) that scores each completion against the others of its group.
"""

import verifiers as vf
from datasets import Dataset

WORDS = ["apple", "river", "stone", "cloud", "amber", "frost", "maple", "ocean"]


def exact(completion, answer) -> float:
    return float(completion[-1].content.strip() == answer)


def reply_chars(completion) -> float:
    return float(len(completion[-1].content))


def unique_in_group(completions) -> list[float]:
    """Group-level: 1 for a reply no other rollout of the group gave, else 0."""
    replies = [c[-1].content.strip() for c in completions]
    return [float(replies.count(reply) == 1) for reply in replies]


def rows(words):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say {w}"}], "answer": w,
                               "info": {"index": i}} for i, w in enumerate(words)])


def load_environment(num_tasks: int = 4, num_eval_tasks: int = 4, with_group_reward: bool = False):
    funcs, weights = [exact, reply_chars], [1.0, 0.0]
    if with_group_reward:
        funcs, weights = [*funcs, unique_in_group], [*weights, 0.5]
    return vf.SingleTurnEnv(dataset=rows(WORDS[:num_tasks]), eval_dataset=rows(WORDS[::-1][:num_eval_tasks]),
                            rubric=vf.Rubric(funcs=funcs, weights=weights))
