"""A single-turn verifiers environment written for the tests: say the word back; exact match is the reward."""

import verifiers.v1 as vf

WORDS = ["apple", "river", "stone", "cloud", "amber", "frost", "maple", "ocean"]


class SayConfig(vf.TasksetConfig):
    num_tasks: int = 4
    offset: int = 0


class SayData(vf.TaskData):
    answer: str


class SayTask(vf.Task[SayData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class SayTaskset(vf.Taskset[SayTask, SayConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            word = WORDS[(i + self.config.offset) % len(WORDS)]
            yield SayTask(SayData(id=f"say-{i + self.config.offset}", prompt=f"Say {word}", answer=word),
                          self.config.task)


__all__ = ["SayTaskset"]
