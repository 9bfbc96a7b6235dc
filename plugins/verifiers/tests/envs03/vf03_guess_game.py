"""A verifiers 0.1-0.3 custom multi-turn environment written for the tests: guess a digit; higher/lower.

`broken: true` makes its setup raise (the environment's own failure, not the model's).
"""

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
    def __init__(self, broken: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.broken = broken

    async def setup_state(self, state):
        if self.broken:
            raise RuntimeError("the game server is down")
        state["guesses"] = 0
        return state

    @vf.stop
    async def guessed_right(self, state) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and trajectory[-1]["completion"][-1].content.strip() == state["answer"]

    async def env_response(self, messages, state, **kwargs):
        state["guesses"] += 1
        guess = messages[-1].content.strip()
        hint = "higher" if not guess.isdigit() or int(guess) < int(state["answer"]) else "lower"
        return [{"role": "user", "content": hint}]


def found(completion, answer) -> float:
    return float(any(m.role == "assistant" and m.content.strip() == answer for m in completion))


def guesses(state) -> float:
    return float(len(state["trajectory"]))


def load_environment(num_tasks: int = 3, max_guesses: int = 3, broken: bool = False):
    data = [{"prompt": [{"role": "user", "content": "Guess my digit (0-9)."}], "answer": str((3 * i + 4) % 10)}
            for i in range(num_tasks)]
    return GuessEnv(dataset=Dataset.from_list(data), max_turns=max_guesses, broken=broken,
                    rubric=vf.Rubric(funcs=[found, guesses], weights=[1.0, 0.0]))
