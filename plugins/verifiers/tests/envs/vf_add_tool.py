"""A tool-use verifiers environment written for the tests: an MCP `add` tool, the sum as the answer."""

import verifiers.v1 as vf


class AddToolsConfig(vf.ToolsetConfig):
    pass


class AddTools(vf.Toolset[AddToolsConfig, vf.State]):
    @vf.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class AddConfig(vf.TasksetConfig):
    num_tasks: int = 3


class AddData(vf.TaskData):
    a: int
    b: int


class AddTask(vf.Task[AddData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [AddTools(AddToolsConfig())]

    @vf.reward(weight=0.5)
    async def correct(self, trace) -> float:
        return float(trace.last_reply.strip() == str(self.data.a + self.data.b))

    @vf.reward(weight=0.5)
    async def used_tool(self, trace) -> float:
        return float(len(trace.tool_messages) > 0)


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            a, b = i + 2, 2 * i + 3
            yield AddTask(AddData(id=f"add-{i}", prompt=f"Add {a} and {b}", a=a, b=b), self.config.task)


__all__ = ["AddTaskset"]

if __name__ == "__main__":  # verifiers starts the tool server as `python -m vf_add_tool`
    AddTools.run()
