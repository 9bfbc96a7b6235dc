"""A verifiers 0.1-0.3 tool environment written for the tests: an `add` tool, the sum as the answer."""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def correct(completion, answer) -> float:
    return float((completion[-1].content or "").strip() == answer)


def used_tool(completion) -> float:
    return float(any(m.role == "tool" for m in completion))


def load_environment(num_tasks: int = 3):
    data = [{"prompt": [{"role": "user", "content": f"Add {i + 2} and {2 * i + 3}"}], "answer": str(3 * i + 5)}
            for i in range(num_tasks)]
    return vf.ToolEnv(dataset=Dataset.from_list(data), tools=[add], max_turns=4,
                      rubric=vf.Rubric(funcs=[correct, used_tool], weights=[0.5, 0.5]))
