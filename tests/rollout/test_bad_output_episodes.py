"""Bad model output, end to end: the gateway answers, the episode is judged or marked, nothing crashes.

A scripted model says something broken on its first turn (empty, invalid UTF-8, broken or unknown tool
calls, a runaway loop, leaked special tokens, ...). A real tool-using agent on the `openai` client
talks to it through the real gateway (over HTTP and in-process, streaming and not) and RolloutEngine,
with a judge. For every kind of garbage: each call got an answer, the agent could go on, the
episode has the expected status (madness checks fire where they should, with the penalty reward and
the judge's verdict kept), the generated token ids are kept exactly, and the episode goes through
the rollout log and back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agenttune import Judge, JudgeInput, JudgeResult, Task, Workflow, WorkflowOutput
from agenttune.components.engines.base import Generation
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.rollout.log import RolloutLog, read_records
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.workflow.episode import EpisodeStatus, Sample

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]
FINAL = "The answer is 4."
PENALTY = -0.5


class CalcAgent(Workflow):
    """Calls the model with a calculator tool until it stops calling tools (at most 3 calls).

    Like a careful real agent, it answers unknown tools and unreadable arguments with an error
    message instead of crashing. Options come from task.metadata: `stream`, `http`.
    """

    async def execute(self, task, tuner):
        client = tuner.as_async_openai_client(http=task.metadata.get("http", False))
        messages = [{"role": "user", "content": "What is 2 + 2?"}]
        for _ in range(3):
            message = await self.ask(client, messages, stream=task.metadata.get("stream", False))
            messages.append(message)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool(call["function"])})
        tuner.update_judge_input_dictionary(final_answer=messages[-1].get("content") or "")
        return WorkflowOutput(metadata={"final_answer": messages[-1].get("content") or "", "turns": len(messages)})

    async def ask(self, client, messages, *, stream: bool) -> dict:
        if not stream:
            reply = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            return reply.choices[0].message.model_dump(exclude_none=True)
        content, calls = "", {}
        async for chunk in await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True):
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            content += delta.content or ""
            for call in delta.tool_calls or []:  # the id and name first, then argument fragments (OpenAI's shape)
                entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                entry["id"] += call.id or ""
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [calls[index] for index in sorted(calls)]
        return message


def run_tool(function: dict) -> str:
    if function["name"] != "calc":
        return f"error: there is no tool called {function['name']!r}"
    try:
        expression = json.loads(function["arguments"]).get("expr", "")
    except (ValueError, AttributeError):
        return "error: the arguments are not a JSON object"
    return "4" if expression.replace(" ", "") == "2+2" else "error: I only know 2 + 2"


class AnswerJudge(Judge):
    name = "bad_output_answer"

    def judge(self, judge_input: JudgeInput) -> JudgeResult:
        answer = str(judge_input.final_answer)
        return JudgeResult(reward=float("4" in answer), success="4" in answer, details={"judged": True})


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@dataclass
class Garbage:
    """What the model says first, and what must become of the episode."""

    first: object  # text, token ids (ending as the engine ends them), or a Generation
    status: EpisodeStatus
    madness: list[str] = field(default_factory=list)
    trainable: bool = True
    calls: int = 2  # the garbage, then the model's sane final answer


def garbage(tokenizer) -> dict[str, Garbage]:
    eos = tokenizer.eos_token_id
    lead_byte = ids(tokenizer, "é")[0]  # the first byte of a two-byte character, on its own: invalid UTF-8
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    return {
        "empty reply (only the stop token)": Garbage([eos], EpisodeStatus.OK, calls=1),
        "no tokens at all": Garbage(Generation([], None, "stop"), EpisodeStatus.NOT_TRAINABLE, trainable=False, calls=1),
        "invalid UTF-8": Garbage([lead_byte, lead_byte, *ids(tokenizer, " 4"), lead_byte, eos], EpisodeStatus.OK, calls=1),
        "broken tool-call JSON": Garbage('<tool_call>\n{"name": "calc", "arguments": {expr: 2+2}}\n</tool_call>',
                                         EpisodeStatus.MADNESS, ["wrong_toolcall"], calls=1),
        "tool call cut off by max_tokens": Garbage(ids(tokenizer, '<tool_call>\n{"name": "calc", "argu'),
                                                   EpisodeStatus.MADNESS, ["wrong_toolcall"], calls=1),
        "tool call without a name": Garbage('<tool_call>\n{"arguments": {"expr": "2+2"}}\n</tool_call>',
                                            EpisodeStatus.MADNESS, ["wrong_toolcall"], calls=1),
        "arguments that are a list": Garbage('<tool_call>\n{"name": "calc", "arguments": [1, 2]}\n</tool_call>',
                                             EpisodeStatus.MADNESS, ["wrong_toolcall"], calls=1),
        "unpaired \\ud800 escape in a tool call": Garbage(
            '<tool_call>\n{"name": "calc", "arguments": {"expr": "\\ud800"}}\n</tool_call>',
            EpisodeStatus.MADNESS, ["wrong_toolcall"], calls=1),
        "unknown tool": Garbage('<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>',
                                EpisodeStatus.MADNESS, ["wrong_toolcall"]),
        "known tool, bad arguments": Garbage('<tool_call>\n{"name": "calc", "arguments": {"expr": "7/0"}}\n</tool_call>',
                                             EpisodeStatus.OK),
        "runaway repetition": Garbage("ha " * 60, EpisodeStatus.MADNESS, ["nonsense"], calls=1),
        "leaked special token": Garbage([*ids(tokenizer, "4 "), im_start, *ids(tokenizer, "user"), eos],
                                        EpisodeStatus.MADNESS, ["nonsense"], calls=1),
        # The characters of a special token, typed one piece at a time: text, not a special token.
        "special-token text typed out": Garbage([*ids(tokenizer, "<|"), *ids(tokenizer, "im_end"), *ids(tokenizer, "|> 4"),
                                                 eos], EpisodeStatus.OK, calls=1),
        "unclosed reasoning": Garbage("<think>\nhmm, 2 + 2 is", EpisodeStatus.OK, calls=1),
        "NUL and control characters": Garbage("4\x00\x07\x1b[31m", EpisodeStatus.OK, calls=1),
    }


TOKENIZER = tiny_tokenizer()
CASES = garbage(TOKENIZER)


def as_ids(reply: object) -> list[int] | None:
    """The ids the scripted engine will return for `reply` (None for a Generation without ids)."""
    if isinstance(reply, Generation):
        return reply.token_ids or None
    if isinstance(reply, str):
        return ids(TOKENIZER, reply) + [TOKENIZER.eos_token_id]
    return list(reply)


@pytest.mark.slow  # one end-to-end episode per kind of garbage
@pytest.mark.parametrize("transport", ["in-process", "http", "in-process streaming", "http streaming"])
@pytest.mark.parametrize("name", list(CASES))
async def test_garbage_is_answered_and_the_episode_judged_or_marked(name, transport, tmp_path: Path):
    case = CASES[name]
    engine = ScriptedEngine([case.first, FINAL], tokenizer=TOKENIZER)
    config = tiny_config(model={"max_model_len": 2048},
                         rollout={"num_repeat": 1, "max_response_length_in_one_turn": 64,
                                  "agent_madness_reward": PENALTY, "episode_timeout": 30},
                         # the judge's isolation is not what these cases are about (test_judge_isolation.py is);
                         # starting its worker processes took ~10 of each case's ~12 s
                         judge={"isolation": "thread"})
    task = Task(task_id="t", query="2 + 2", metadata={"http": "http" in transport, "stream": "streaming" in transport})
    async with running_gateway(engine, config=config) as gateway:
        async with RolloutEngine(config, gateway, CalcAgent, AnswerJudge()) as rollout:
            [episode] = await rollout.run_tasks([task])

    assert episode.status is case.status, episode.error
    assert episode.metrics["calls"] == case.calls == len(engine.prompts)  # every call was answered
    assert episode.judge_details.get("judged") is True  # the judge ran, whatever the model said
    if case.madness:
        assert episode.judge_details["madness"] == case.madness
        assert episode.reward == PENALTY and "judge_reward" in episode.judge_details
    else:
        assert "madness" not in episode.judge_details
    assert all(sample.trainable is case.trainable for sample in episode.samples)
    first_ids = as_ids(case.first)
    if first_ids is not None:  # the model's exact ids are what would be trained on, garbage included
        sample = episode.samples[0]
        generated = [token for token, mask in zip(sample.response_ids, sample.loss_mask, strict=True) if mask]
        assert generated[: len(first_ids)] == first_ids[:64]

    log = RolloutLog(tmp_path / "rollouts")
    [record] = read_records(log.write(1, "train", [episode], TOKENIZER))
    assert record.status is episode.status and record.reward == episode.reward
    for logged, sample in zip(record.samples, episode.samples, strict=True):
        assert logged.model_dump(include=set(Sample.model_fields)) == sample.model_dump()
    assert record.messages == json.loads(json.dumps(episode.messages))


async def test_the_gateway_keeps_serving_other_episodes_after_every_kind_of_garbage():
    """All of the garbage at once, in one batch with sane episodes, on one gateway."""
    replies = {name: case.first for name, case in CASES.items()}
    sane = "<tool_call>\n" + json.dumps({"name": "calc", "arguments": {"expr": "2+2"}}) + "\n</tool_call>"

    def responder(prompt_ids, sampling):
        prompt = TOKENIZER.decode(prompt_ids)
        if "<tool_response>" in prompt:
            return FINAL
        for name, reply in replies.items():
            if f"[{name}]" in prompt:
                return reply
        return sane

    class TaggedAgent(CalcAgent):
        async def execute(self, task, tuner):
            client = tuner.as_async_openai_client()
            messages = [{"role": "user", "content": f"What is 2 + 2? [{task.metadata['case']}]"}]
            for _ in range(3):
                message = await self.ask(client, messages, stream=False)
                messages.append(message)
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool(call["function"])})
            tuner.update_judge_input_dictionary(final_answer=messages[-1].get("content") or "")
            return WorkflowOutput()

    engine = ScriptedEngine(tokenizer=TOKENIZER, responder=responder)
    config = tiny_config(model={"max_model_len": 2048},
                         rollout={"num_repeat": 2, "max_env_worker": 64, "max_response_length_in_one_turn": 64})
    tasks = [Task(task_id=name, metadata={"case": name}) for name in [*CASES, "sane 1", "sane 2"]]
    async with running_gateway(engine, config=config) as gateway:
        async with RolloutEngine(config, gateway, TaggedAgent, AnswerJudge()) as rollout:
            episodes = await rollout.run_tasks(tasks)
        import httpx

        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{gateway.root_url}/health")).json()["status"] == "ok"
    by_task = {episode.task.task_id: episode for episode in episodes}
    for name, case in CASES.items():
        assert by_task[name].status is case.status, (name, by_task[name].error)
    for name in ("sane 1", "sane 2"):
        assert by_task[name].status is EpisodeStatus.OK and by_task[name].reward == 1.0
    assert all(episode.judge_details.get("judged") for episode in episodes)
