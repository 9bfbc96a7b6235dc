"""A custom multi-turn verifiers environment written for the tests: guess a digit; the env answers higher/lower."""

import verifiers.v1 as vf


class GuessConfig(vf.TasksetConfig):
    num_tasks: int = 3


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, trace) -> float:
        return float(any(m.content and m.content.strip() == str(self.data.secret) for m in trace.assistant_messages))

    @vf.metric
    async def guesses(self, trace) -> float:
        return float(len(trace.assistant_messages))


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            secret = (3 * i + 4) % 10
            yield GuessTask(GuessData(id=f"guess-{i}", prompt="Guess my digit (0-9).", secret=secret),
                            self.config.task)


class GuessEnvConfig(vf.SingleAgentEnvConfig):
    max_guesses: int = 3


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The environment plays the user: after each guess it says higher, lower or correct."""

    async def run(self, task, agents) -> None:
        async with agents.agent.interaction(task) as talk:
            segment = await talk.turn()
            for _ in range(self.config.max_guesses - 1):
                if segment.terminated:
                    return
                guess = segment.last_reply.strip()
                if guess == str(task.data.secret):
                    return
                hint = "higher" if not guess.isdigit() or int(guess) < task.data.secret else "lower"
                segment = await talk.turn(hint)


__all__ = ["GuessTaskset", "GuessEnv"]
