"""Every hook, one test each: a plugin implementing it really changes what agenttune does.

The plugin below is written as a third-party plugin is (imports from `agenttune.plugin_api` only)
and registered for each test; every test goes through the product path (the `agenttune` command,
a debug run with the gateway and the tiny model's tokenizer), not through the registry alone.
As datasette does, the last test checks that every hookspec has its `test_hook_<name>` here.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from agenttune.plugin_api import (
    AdvantageEstimator,
    Advantages,
    AgentFramework,
    AgentTuneConfig,
    Backbone,
    EpisodeStatus,
    Generation,
    InferenceEngine,
    Judge,
    JudgeInput,
    JudgeResult,
    LossInput,
    LossOutput,
    ModelTuner,
    PolicyLoss,
    ReasoningParser,
    Run,
    SamplingParams,
    Task,
    TaskReader,
    ToolParse,
    ToolParser,
    UserError,
    Workflow,
    WorkflowOutput,
    hookimpl,
    read_records,
    reference_for,
)
from agenttune.registry import hookspecs

REPLY = "forty-two"


class CountdownOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    numbers: int = Field(default=3, description="How many tasks.")


class CountdownReader(TaskReader):
    name = "countdown"
    Options = CountdownOptions

    def read(self, split: str) -> Iterator[Task]:
        for n in range(self.options.numbers):
            yield Task(task_id=f"{split}-{n}", query=f"Count down from {n}.", metadata={"ground_truth": n})


class EchoModel:
    def __init__(self, base_url: str, api_key: str, setting: str):
        self.base_url, self.api_key, self.setting = base_url, api_key, setting


class EchoFramework(AgentFramework):
    """The framework's 'model' is just where the episode's endpoint is: enough to see it handed over."""

    name = "echo"
    setups: list[Path] = []

    def setup(self, run_dir: Path) -> None:
        EchoFramework.setups.append(run_dir)

    def model_for(self, tuner: ModelTuner, **kwargs: Any) -> EchoModel:
        return EchoModel(tuner.base_url, tuner.api_key, **kwargs)


class LengthJudgeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_character: float = Field(default=0.01, description="Reward per character of the answer.")


class LengthJudge(Judge):
    name = "answer_length"
    Options = LengthJudgeOptions

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = str(judge_input.final_answer)
        return JudgeResult(reward=len(answer) * self.options.per_character, success=bool(answer),
                           details={"answer": answer})


class FixedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reply: str = Field(default=REPLY, description="What the engine always says.")


class FixedEngine(InferenceEngine):
    """Always generates `reply` (+ end of turn), with logprob -0.5 per token."""

    name = "fixed"
    Options = FixedOptions

    def __init__(self, ids: list[int]):
        self.ids = ids
        self.prompts: list[list[int]] = []

    @classmethod
    def from_config(cls, config: Any, options: FixedOptions, tokenizer: Any, *, model: Any = None) -> FixedEngine:
        return cls(tokenizer.encode(options.reply, add_special_tokens=False) + [tokenizer.eos_token_id])

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       request_id: str | None = None) -> Generation:
        self.prompts.append(list(prompt_ids))
        return Generation(list(self.ids), [-0.5] * len(self.ids), "stop")


class BangToolParser(ToolParser):
    """`name!` is a call of `name` with no arguments."""

    name = "bang"

    def parse(self, text: str) -> ToolParse:
        if not text.endswith("!"):
            return ToolParse(text)
        call = {"id": "call_bang", "type": "function", "function": {"name": text[:-1], "arguments": "{}"}}
        return ToolParse("", [call])


class AsideParser(ReasoningParser):
    """`(aside: reasoning) answer`."""

    name = "aside"
    OPEN, CLOSE = "(aside:", ")"

    def split(self, text: str) -> tuple[str | None, str]:
        if not text.startswith(self.OPEN) or self.CLOSE not in text:
            return None, text
        reasoning, answer = text[len(self.OPEN):].split(self.CLOSE, 1)
        return reasoning.strip(), answer.strip()


class HelloSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    greeting: str = Field(default="hello", description="What the note backbone writes.")
    service: bool = Field(default=False, description="Start the hello service for the run.")


class NoteBackbone(Backbone):
    """Writes the greeting (and whether the service is up) into the run directory."""

    name = "note"

    @classmethod
    def native_config(cls, config: AgentTuneConfig) -> dict[str, Any] | None:
        return {"note_greeting": config.section("hello").greeting}

    def run(self, run: Run) -> None:
        service_up = (run.run_dir / "service.state").is_file() and \
            (run.run_dir / "service.state").read_text() == "running"
        (run.run_dir / "note.json").write_text(json.dumps({
            "greeting": run.config.section("hello").greeting, "service_up": service_up}))
        if run.config.section("hello").greeting == "crash":
            raise UserError("the note backbone was told to crash", hint="(a test)")


@contextmanager
def hello_service(run_dir: Path) -> Iterator[None]:
    state = run_dir / "service.state"
    state.write_text("running")
    try:
        yield
    finally:
        state.write_text("stopped")


class HooksPlugin:
    """One plugin implementing every hook."""

    @staticmethod
    @hookimpl
    def register_task_readers() -> list[type]:
        return [CountdownReader]

    @staticmethod
    @hookimpl
    def register_agent_frameworks() -> list[type]:
        return [EchoFramework]

    @staticmethod
    @hookimpl
    def register_judges() -> list[type]:
        return [LengthJudge]

    @staticmethod
    @hookimpl
    def register_backbones() -> list[type]:
        return [NoteBackbone]

    @staticmethod
    @hookimpl
    def register_engines() -> list[type]:
        return [FixedEngine]

    @staticmethod
    @hookimpl
    def register_tool_parsers() -> list[type]:
        return [BangToolParser]

    @staticmethod
    @hookimpl
    def register_reasoning_parsers() -> list[type]:
        return [AsideParser]

    @staticmethod
    @hookimpl
    def register_config_sections() -> dict[str, type[BaseModel]]:
        return {"hello": HelloSettings}

    @staticmethod
    @hookimpl
    def run_services(config: AgentTuneConfig, run: Run) -> Any:
        return hello_service(run.run_dir) if config.section("hello").service else None

    @staticmethod
    @hookimpl
    def register_commands(app: Any) -> None:
        import typer

        @app.command("hello-hooks")
        def hello(name: str = typer.Option("world", "--name")) -> None:
            """Say hello (added by a plugin)."""
            typer.echo(f"hello {name}")


class AnswerWorkflow(Workflow):
    """Asks the model once and hands its answer to the judge."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        reply = await client.chat.completions.create(model=tuner.model_name,
                                                     messages=[{"role": "user", "content": task.query}])
        answer = reply.choices[0].message.content or ""
        tuner.update_judge_input_dictionary(final_answer=answer)
        return WorkflowOutput(metadata={"final_answer": answer})


class FrameworkWorkflow(Workflow):
    """Rewarded 1 when the configured framework's model points at this episode's gateway endpoint."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        model = tuner.as_model("echo", setting="from-the-workflow")
        right = (isinstance(model, EchoModel) and model.base_url == tuner.base_url
                 and model.api_key == tuner.api_key and model.setting == "from-the-workflow")
        return WorkflowOutput(reward=1.0 if right else 0.0)


class ToolWorkflow(Workflow):
    """Offers one tool; rewarded 1 when the reply calls it (and says nothing else)."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        tool = {"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}
        reply = await client.chat.completions.create(model=tuner.model_name, tools=[tool],
                                                     messages=[{"role": "user", "content": task.query}])
        message = reply.choices[0].message
        called = [call.function.name for call in message.tool_calls or []]
        return WorkflowOutput(reward=1.0 if called == ["count"] and not message.content else 0.0)


class ReasoningWorkflow(Workflow):
    """Rewarded 1 when the reply's reasoning and answer come back apart."""

    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        reply = await client.chat.completions.create(model=tuner.model_name,
                                                     messages=[{"role": "user", "content": task.query}])
        message = reply.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning_content")
        return WorkflowOutput(reward=1.0 if (reasoning, message.content) == ("hmm", "seven") else 0.0)


@pytest.fixture
def plugin(register_plugin):
    register_plugin(HooksPlugin(), name="hooks", distribution="agenttune-plugin-hooks")
    EchoFramework.setups.clear()


@pytest.fixture
def config(write_yaml, tmp_path):
    """A debug-run config on the tiny tokenizer; keyword arguments replace its sections."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"query": f"question {n}"}) + "\n" for n in range(2)))

    def write(**sections: Any) -> Path:
        data = {"backbone": "debug", "model": {"path": "tiny://default", "max_model_len": 1024},
                "workflow": reference_for(AnswerWorkflow),
                "task_reader": {"type": "file", "path": str(tasks)},
                "engine": {"type": "fixed"},
                "rollout": {"num_repeat": 1},
                "debug": {"first_n_tasks": 2, "max_parallel": 1}}
        data.update(sections)
        return write_yaml(data)

    return write


def debug_run(run_cli, conf: Path, run_dir: Path) -> list[Any]:
    result = run_cli("train", "--conf", conf, "--backbone", "debug", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    [log] = sorted((run_dir / "rollouts").glob("*.jsonl"))
    records = list(read_records(log))
    assert [record.status for record in records] == [EpisodeStatus.OK] * len(records), records[0].error
    return records


def test_hook_register_task_readers(plugin, run_cli, config):
    conf = config(task_reader={"type": "countdown", "numbers": 4})
    result = run_cli("data", "preview", "--conf", conf, "--json")
    assert result.exit_code == 0, result.output
    tasks = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [task["query"] for task in tasks] == [f"Count down from {n}." for n in range(4)]
    assert [task["metadata"]["ground_truth"] for task in tasks] == [0, 1, 2, 3]

    typo = run_cli("data", "preview", "--conf", config(task_reader={"type": "countdown", "number": 4}))
    assert typo.exit_code == 2 and "numbers" in typo.error  # the reader's Options validate its section


def test_hook_register_agent_frameworks(plugin, run_cli, config, tmp_path):
    conf = config(workflow=reference_for(FrameworkWorkflow), agent_framework="echo")
    records = debug_run(run_cli, conf, tmp_path / "run")
    assert [record.reward for record in records] == [1.0, 1.0]
    assert EchoFramework.setups == [tmp_path / "run"]  # set up once per run, in its directory


def test_hook_register_judges(plugin, run_cli, config, tmp_path):
    conf = config(judge={"type": "answer_length", "per_character": 0.1})
    records = debug_run(run_cli, conf, tmp_path / "run")
    assert [record.reward for record in records] == pytest.approx([0.1 * len(REPLY)] * 2)
    assert all(record.success for record in records)


def test_hook_register_backbones(plugin, run_cli, config, tmp_path):
    conf = config(hello={"greeting": "hi there"})
    result = run_cli("train", "--conf", conf, "--backbone", "note", "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "note.json").read_text())["greeting"] == "hi there"

    shown = run_cli("config", "show", "--conf", conf, "--backbone", "note")
    assert shown.exit_code == 0, shown.output
    assert "note_greeting: hi there" in shown.stdout  # the backbone's native config


def test_hook_register_engines(plugin, run_cli, config, tmp_path):
    from agenttune.testing import tiny_tokenizer

    conf = config(engine={"type": "fixed", "reply": "seven"}, judge={"type": "answer_length"})
    records = debug_run(run_cli, conf, tmp_path / "run")
    expected = tiny_tokenizer().encode("seven", add_special_tokens=False) + [tiny_tokenizer().eos_token_id]
    for record in records:
        [sample] = record.samples
        assert sample.response_ids == expected  # exactly what the plugin's engine generated
        assert sample.logprobs == [-0.5] * len(expected)
        assert record.reward == pytest.approx(0.01 * len("seven"))

    typo = run_cli("train", "--conf", config(engine={"type": "fixed", "replly": "x"}), "--backbone", "debug")
    assert typo.exit_code == 2 and "reply" in typo.error


def test_hook_register_tool_parsers(plugin, run_cli, config, tmp_path):
    conf = config(workflow=reference_for(ToolWorkflow), engine={"type": "fixed", "reply": "count!"},
                  gateway={"tool_parser": "bang"})
    records = debug_run(run_cli, conf, tmp_path / "run")
    assert [record.reward for record in records] == [1.0, 1.0]

    typo = run_cli("train", "--conf", config(gateway={"tool_parser": "bnag"}), "--backbone", "debug")
    assert typo.exit_code == 2 and "Available: bang, hermes" in typo.error

    listed = {info["name"]: info for info in json.loads(run_cli("plugins", "list", "--json").stdout)}
    assert (listed["hooks"]["tool_parsers"], listed["builtins"]["tool_parsers"]) == (["bang"], ["hermes"])


def test_hook_register_reasoning_parsers(plugin, run_cli, config, tmp_path):
    conf = config(workflow=reference_for(ReasoningWorkflow), engine={"type": "fixed", "reply": "(aside: hmm) seven"},
                  gateway={"reasoning_parser": "aside"})
    records = debug_run(run_cli, conf, tmp_path / "run")
    assert [record.reward for record in records] == [1.0, 1.0]

    typo = run_cli("train", "--conf", config(gateway={"reasoning_parser": "asdie"}), "--backbone", "debug")
    assert typo.exit_code == 2 and "Available: aside, think" in typo.error

    listed = {info["name"]: info for info in json.loads(run_cli("plugins", "list", "--json").stdout)}
    assert (listed["hooks"]["reasoning_parsers"], listed["builtins"]["reasoning_parsers"]) == (["aside"], ["think"])


def test_hook_register_config_sections(plugin, run_cli, config):
    shown = run_cli("config", "show", "--conf", config(hello={"greeting": "bonjour"}))
    assert shown.exit_code == 0, shown.output
    assert "hello:\n  greeting: bonjour\n" in shown.stdout

    typo = run_cli("config", "show", "--conf", config(hello={"greting": "bonjour"}))
    assert typo.exit_code == 2
    assert "hello.greting" in typo.error and "greeting" in typo.error


class EveryoneUp(AdvantageEstimator):
    """Advantage +1 for every episode, whatever its reward; remembers what it was shown."""

    name = "everyone_up"
    min_group_size = 1
    seen: list[dict[str, list[float]]] = []

    def estimate(self, groups):
        EveryoneUp.seen.append({group: [member.reward for member in members] for group, members in groups.items()})
        return Advantages({member.episode_id: 1.0 for members in groups.values() for member in members})

    def informative(self, group):
        return True


class PlainReinforce(PolicyLoss):
    """-A log π per token; remembers the advantages it was given."""

    name = "plain_reinforce"
    seen: list[list[float]] = []

    def __call__(self, batch: LossInput) -> LossOutput:
        PlainReinforce.seen.append(batch.advantages.tolist())
        per_token = -batch.advantages.unsqueeze(-1) * batch.logprobs
        return LossOutput(per_token, per_token.detach() * 0)


class AnswerLengthJudge(Judge):
    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        return JudgeResult(reward=float(len(str(judge_input.final_answer)) % 3))


class ObjectivePlugin:
    @staticmethod
    @hookimpl
    def register_advantage_estimators():
        return [EveryoneUp]

    @staticmethod
    @hookimpl
    def register_policy_losses():
        return [PlainReinforce]


def local_run(run_cli, config, run_dir: Path, **algorithm: Any) -> list[dict[str, Any]]:
    """One local training step on the tiny model (hf engine), with these `algorithm` settings."""
    pytest.importorskip("torch")
    conf = config(engine={"type": "hf"}, rollout={"num_repeat": 2, "max_response_length_in_one_turn": 4},
                  judge={"judge_protocol": reference_for(AnswerLengthJudge)},
                  data={"train_batch_size": 1}, algorithm=algorithm,
                  trainer={"total_steps": 1, "learning_rate": 1e-3},
                  local={"device": "cpu", "plot": False}, monitor={"tensorboard": False})
    result = run_cli("train", "--conf", conf, "--backbone", "local", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_hook_register_advantage_estimators(register_plugin, run_cli, config, tmp_path):
    register_plugin(ObjectivePlugin(), name="objectives", distribution="agenttune-plugin-objectives")
    EveryoneUp.seen.clear()
    [metrics] = local_run(run_cli, config, tmp_path / "run", adv_estimator="everyone_up")
    assert len(EveryoneUp.seen) == 1 and [len(rewards) for rewards in EveryoneUp.seen[0].values()] == [2]
    assert metrics["train/samples"] == 2 and metrics["train/updates"] == 1


@pytest.mark.slow
def test_hook_register_policy_losses(register_plugin, run_cli, config, tmp_path):
    register_plugin(ObjectivePlugin(), name="objectives", distribution="agenttune-plugin-objectives")
    PlainReinforce.seen.clear()
    local_run(run_cli, config, tmp_path / "run", adv_estimator="everyone_up", policy_loss="plain_reinforce")
    assert PlainReinforce.seen and all(value == 1.0 for batch in PlainReinforce.seen for value in batch)


def test_hook_run_services(plugin, run_cli, config, tmp_path):
    result = run_cli("train", "--conf", config(hello={"service": True}), "--backbone", "note",
                     "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "note.json").read_text())["service_up"] is True
    assert (tmp_path / "run" / "service.state").read_text() == "stopped"  # and stopped when the run ended

    crashed = run_cli("train", "--conf", config(hello={"service": True, "greeting": "crash"}), "--backbone",
                      "note", "--run-dir", tmp_path / "crashed")
    assert crashed.exit_code == 2 and "told to crash" in crashed.error
    assert (tmp_path / "crashed" / "service.state").read_text() == "stopped"  # also when it failed

    run_cli("train", "--conf", config(), "--backbone", "note", "--run-dir", tmp_path / "without")
    assert not (tmp_path / "without" / "service.state").exists()  # the hook returned None: no service


def test_hook_register_commands(plugin, run_cli):
    from agenttune.entrypoints.cli.main import app

    try:
        result = run_cli("hello-hooks", "--name", "agent")
        assert (result.exit_code, result.stdout) == (0, "hello agent\n")
    finally:  # commands stay on the process-wide app: leave it as it was
        app.registered_commands[:] = [command for command in app.registered_commands
                                      if command.name != "hello-hooks"]


def test_every_hookspec_has_a_test_here():
    hooks = [name for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
             if hasattr(function, "agenttune_spec")]
    assert hooks, "no hookspecs found"
    tests = {name for name, _ in inspect.getmembers(sys.modules[__name__], inspect.isfunction)}
    missing = [hook for hook in hooks if f"test_hook_{hook}" not in tests]
    assert missing == [], f"hooks without a test_hook_<name> in {Path(__file__).name}: {missing}"
