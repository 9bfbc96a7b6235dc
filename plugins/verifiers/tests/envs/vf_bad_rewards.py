"""An environment whose reward function raises for one task and hangs for another, or whose setup raises (`mode`)."""

import time

import verifiers.v1 as vf


class BadData(vf.TaskData):
    mode: str


class BadTask(vf.Task[BadData, vf.State, vf.TaskConfig]):
    async def setup(self, trace, runtime) -> None:
        if self.data.mode == "setup":
            raise RuntimeError("the task's setup is broken")

    @vf.reward
    async def checked(self, trace) -> float:  # time.sleep: a hang that never yields to the event loop
        if self.data.mode == "raise":
            raise ValueError("this reward function is broken")
        if self.data.mode == "hang":
            time.sleep(3600)
        return 1.0


class BadConfig(vf.TasksetConfig):
    modes: list[str] = ["ok", "raise", "hang"]


class BadTaskset(vf.Taskset[BadTask, BadConfig]):
    def load(self):
        for mode in self.config.modes:
            yield BadTask(BadData(id=mode, prompt="Say anything", mode=mode), self.config.task)


__all__ = ["BadTaskset"]
