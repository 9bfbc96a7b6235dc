"""Timelines: exact token ids, loss masks and merges on multi-turn tool-calling conversations.

The scripted engine replays chosen replies, so every id, mask entry and logprob can be checked.
The reference for the glue between turns is transformers' own `apply_chat_template`.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from agenttune.components.engines.base import Generation, SamplingParams
from agenttune.components.engines.scripted import ScriptedEngine, scripted_logprob
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config

TOOLS = [
    {"type": "function", "function": {"name": "calc", "description": "Evaluate arithmetic",
                                      "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
]
CALL_1 = ('<think>\nI need two tools.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "calc", "arguments": {"x": 1}}'
          '\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
CALL_2 = '<tool_call>\n{"name": "calc", "arguments": {"x": 2}}\n</tool_call>'
FINAL = "It is 3 and sunny."


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


def client_for(channel, agent=None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://gateway.invalid/v1", api_key=channel.api_key(agent), max_retries=0,
                              http_client=httpx.AsyncClient(transport=channel.async_transport()))


async def ask(client, messages, **kwargs) -> dict:
    """One call; returns the reply as a client echoes it back (the openai message, dumped)."""
    response = await client.chat.completions.create(model="anything", messages=messages, **kwargs)
    return response.choices[0].message.model_dump(exclude_none=True)


def template_text(tokenizer, messages, *, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=generation_prompt,
                                         tokenize=False)


def generated_ids(tokenizer, *replies: str) -> list[int]:
    return [token for reply in replies
            for token in tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]]


async def tool_conversation(channel, *, echo=lambda message: message):
    """user -> 2 parallel calls -> 2 results -> 1 call -> result + user -> final answer."""
    client = client_for(channel)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2 and weather?"}]
    first = await ask(client, messages, tools=TOOLS)
    messages += [echo(first), {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "3"},
                 {"role": "tool", "tool_call_id": first["tool_calls"][1]["id"], "content": "sunny"}]
    second = await ask(client, messages, tools=TOOLS)
    messages += [echo(second), {"role": "tool", "tool_call_id": second["tool_calls"][0]["id"], "content": "4"},
                 {"role": "user", "content": "So?"}]
    final = await ask(client, messages, tools=TOOLS)
    return messages, [first, second, final]


async def test_tool_calling_turns_merge_into_one_exact_sample(tokenizer):
    engine = ScriptedEngine([CALL_1, CALL_2, FINAL], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        messages, replies = await tool_conversation(channel)

    assert replies[0]["reasoning_content"] == "I need two tools."
    assert replies[0]["content"] == "Let me check."
    assert [call["function"]["name"] for call in replies[0]["tool_calls"]] == ["calc", "get_weather"]
    assert "content" not in replies[1] and replies[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 2}'
    assert replies[2]["content"] == FINAL

    [sample] = channel.samples()
    assert sample.num_calls == 3 and channel.metrics()["merge_breaks"] == 0
    context = sample.prompt_ids + sample.response_ids
    # Every prompt the engine saw is the merged context up to that call, and equals what the chat
    # template renders for that call's messages (so the glue between turns is exactly right).
    conversation_at = [messages[:2], messages[:5], messages[:8]]
    for prompt, history in zip(engine.prompts, conversation_at, strict=True):
        assert context[: len(prompt)] == prompt
        assert tokenizer.decode(prompt) == template_text(tokenizer, history, generation_prompt=True)
    assert tokenizer.decode(context) + "\n" == template_text(
        tokenizer, [*messages, {"role": "assistant", "content": FINAL}], generation_prompt=False)
    # Loss mask: 1 exactly on the generated ids (each reply + its end-of-turn token), logprobs aligned.
    trained = [token for token, mask in zip(sample.response_ids, sample.loss_mask, strict=True) if mask]
    assert trained == generated_ids(tokenizer, CALL_1, CALL_2, FINAL)
    assert sample.prompt_ids == engine.prompts[0]
    for token, mask, logprob in zip(sample.response_ids, sample.loss_mask, sample.logprobs, strict=True):
        assert logprob == (scripted_logprob(token) if mask else 0.0)
    # The generated segments sit exactly where the engine produced them.
    first_len = len(generated_ids(tokenizer, CALL_1))
    assert sample.loss_mask[:first_len] == [1] * first_len
    assert sample.loss_mask[first_len] == 0
    assert len(engine.prompts[1]) == len(sample.prompt_ids) + first_len + sample.loss_mask[first_len:].index(1)


async def test_delta_is_the_new_messages_tokenized_alone(tokenizer):
    """Context ids between turns are the tokenization of the glue + new messages, not a re-tokenization."""
    engine = ScriptedEngine([CALL_1, CALL_2, FINAL], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        messages, _ = await tool_conversation(channel)
    [sample] = channel.samples()
    after_first = len(engine.prompts[0]) + len(generated_ids(tokenizer, CALL_1))
    delta = engine.prompts[1][after_first:]
    expected = "\n" + template_text(tokenizer, messages[:5], generation_prompt=True).rsplit(
        "</tool_call><|im_end|>\n", 1)[1]
    assert delta == tokenizer.encode(expected, add_special_tokens=False)
    assert sample.response_ids[after_first - len(sample.prompt_ids):][: len(delta)] == delta


@pytest.mark.parametrize("edit, reason", [
    (lambda messages, reply: [{"role": "system", "content": "Be long."}, *messages[1:], reply], "history_rewritten"),
    (lambda messages, reply: [*messages, {k: v for k, v in reply.items() if k != "reasoning_content"}],
     "dropped_thinking"),
    (lambda messages, reply: [*messages, {**reply, "content": "Edited."}], "reply_modified"),
    (lambda messages, reply: [*messages, {"role": "user", "content": "skip the reply"}], "reply_missing"),
    (lambda messages, reply: messages, "repeated_request"),
    (lambda messages, reply: [*messages, reply], "no_new_messages"),
])
async def test_rewritten_histories_start_a_new_sample(tokenizer, edit, reason):
    engine = ScriptedEngine(["<think>\nok\n</think>\n\nHello.", "Again."], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = client_for(channel)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        reply = await ask(client, messages)
        second = edit(messages, reply)
        if reason != "repeated_request" and reason != "no_new_messages":
            second = [*second, {"role": "user", "content": "More"}] if second[-1]["role"] == "assistant" else second
        await ask(client, second)
    samples = channel.samples()
    assert [sample.num_calls for sample in samples] == [1, 1]
    assert channel.metrics()["merge_breaks"] == 1
    assert channel.metrics()[f"merge_break/{reason}"] == 1
    # A fresh sample's prompt is the full rendering of its messages, tokenized.
    assert samples[1].prompt_ids == tokenizer.encode(
        tokenizer.apply_chat_template(second, add_generation_prompt=True, tokenize=False), add_special_tokens=False)


async def test_changed_tools_start_a_new_sample(tokenizer):
    engine = ScriptedEngine(["One.", "Two."], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = client_for(channel)
        messages = [{"role": "user", "content": "Hi"}]
        reply = await ask(client, messages, tools=TOOLS)
        await ask(client, [*messages, reply, {"role": "user", "content": "More"}], tools=TOOLS[:1])
    assert channel.metrics()["merge_break/tools_changed"] == 1 and len(channel.samples()) == 2


async def test_client_reformatted_tool_arguments_still_merge(tokenizer):
    """Frameworks re-serialise arguments (spacing, key order); that is not a rewrite."""
    engine = ScriptedEngine(['<tool_call>\n{"name": "calc", "arguments": {"x": 1, "y": "a"}}\n</tool_call>', "Done."],
                            tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = client_for(channel)
        messages = [{"role": "user", "content": "Hi"}]
        reply = await ask(client, messages, tools=TOOLS)
        reply["tool_calls"][0]["function"]["arguments"] = '{"y":"a","x":1}'
        reply["content"] = None
        await ask(client, [*messages, reply, {"role": "tool", "content": "1"}], tools=TOOLS)
    [sample] = channel.samples()
    assert sample.num_calls == 2


async def test_agents_have_separate_timelines_and_trainable_targets_pick_them(tokenizer):
    engine = ScriptedEngine(["S1", "C1", "S2", "C2"], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        solver, critic = client_for(channel, "solver"), client_for(channel, "critic")
        solver_messages = [{"role": "user", "content": "Solve"}]
        critic_messages = [{"role": "user", "content": "Critique"}]
        solver_messages.append(await ask(solver, solver_messages))
        critic_messages.append(await ask(critic, critic_messages))
        solver_messages += [{"role": "user", "content": "Again"}]
        critic_messages += [{"role": "user", "content": "Again"}]
        await ask(solver, solver_messages)
        await ask(critic, critic_messages)
    samples = channel.samples(trainable_targets=["solver"])
    assert [(sample.agent, sample.num_calls, sample.trainable) for sample in samples] == [
        ("solver", 2, True), ("critic", 2, False)]
    assert channel.metrics()["merge_breaks"] == 0
    assert [m["content"] for m in channel.messages("critic")] == ["Critique", "C1", "Again", "C2"]
    assert {m.get("name") for m in channel.messages() if m["role"] == "assistant"} == {"solver", "critic"}


async def test_context_overflow_is_refused_before_generation(tokenizer):
    engine = ScriptedEngine(["never used"], tokenizer=tokenizer)
    config = tiny_config(model={"max_model_len": 64}, rollout={"max_response_length_in_one_turn": 16})
    async with running_gateway(engine, config=config, http=False) as gateway:
        channel = gateway.open_episode("e1", SamplingParams(max_tokens=16))
        with pytest.raises(openai.BadRequestError) as caught:
            await ask(client_for(channel), [{"role": "user", "content": "word " * 60}])
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 64 tokens" in caught.value.message
    assert channel.context_overflow and channel.metrics()["context_overflow"] == 1
    assert engine.prompts == [] and channel.samples() == []


async def test_length_cut_reply_is_closed_by_unmasked_glue(tokenizer):
    """A reply cut by max_tokens has no end-of-turn token; the template's closing is context (mask 0)."""
    engine = ScriptedEngine(["This reply is far too long to fit", "Ok."], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = client_for(channel)
        messages = [{"role": "user", "content": "Hi"}]
        response = await client.chat.completions.create(model="m", messages=messages, max_tokens=3)
        assert response.choices[0].finish_reason == "length"
        reply = response.choices[0].message.model_dump(exclude_none=True)
        await ask(client, [*messages, reply, {"role": "user", "content": "Go on"}])
    [sample] = channel.samples()
    cut = tokenizer.encode("This reply is far too long to fit", add_special_tokens=False)[:3]
    assert sample.response_ids[:3] == cut and sample.loss_mask[:4] == [1, 1, 1, 0]
    assert sample.response_ids[3] == tokenizer.eos_token_id  # <|im_end|> written by the template, not the model
    assert engine.samplings[0].max_tokens == 3


async def test_stop_strings_cut_the_text_but_keep_the_generated_ids(tokenizer):
    engine = ScriptedEngine(["Answer: 42\nObservation: none", "Next."], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = client_for(channel)
        messages = [{"role": "user", "content": "Hi"}]
        reply = await ask(client, messages, stop=["Observation:"])
        assert reply["content"] == "Answer: 42\n"
        await ask(client, [*messages, reply, {"role": "user", "content": "More"}])
    [sample] = channel.samples()
    generated = [token for token, mask in zip(sample.response_ids, sample.loss_mask, strict=True) if mask]
    assert tokenizer.decode(generated).startswith("Answer: 42\nObservation:")
    assert "<|im_end|>" not in tokenizer.decode(generated[:-3])


async def test_text_only_engines_make_the_episode_not_trainable(tokenizer):
    engine = ScriptedEngine([Generation([], None, "stop", text="Plain text.")], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        reply = await ask(client_for(channel), [{"role": "user", "content": "Hi"}])
    assert reply["content"] == "Plain text."
    assert channel.trainable is False
    [sample] = channel.samples()
    assert sample.trainable is False and tokenizer.decode(sample.response_ids) == "Plain text."


@pytest.mark.parametrize("reply, tools, check", [
    ([1, 1, 1], None, "nonsense"),  # "<|im_start|>" leaking into the text
    ("ab " * 40, None, "nonsense"),  # one pattern looping
    ('<tool_call>\n{"name": "calc", "arguments": {x: 1}}\n</tool_call>', TOOLS, "wrong_toolcall"),  # bad JSON
    ('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', TOOLS, "wrong_toolcall"),  # unknown tool
    ('<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call>', None, "wrong_toolcall"),  # no tools offered
])
async def test_madness_checks(tokenizer, reply, tools, check):
    if isinstance(reply, list):
        reply = [*tokenizer.encode("Hello ", add_special_tokens=False), *reply, tokenizer.eos_token_id]
    for checklist, fires in ((["nonsense", "wrong_toolcall"], True), ([], False)):
        engine = ScriptedEngine([reply], tokenizer=tokenizer)
        config = tiny_config(rollout={"compute_madness_checklist": checklist})
        async with running_gateway(engine, config=config, http=False) as gateway:
            channel = gateway.open_episode("e1")
            extra = {"tools": tools} if tools else {}
            message = await ask(client_for(channel), [{"role": "user", "content": "Hi"}], **extra)
        assert channel.madness == ([check] if fires else [])
        assert (channel.metrics().get(f"madness/{check}") == 1.0) is fires
    if check == "wrong_toolcall" and tools:
        assert "tool_calls" not in message or message["tool_calls"][0]["function"]["name"] == "rm_rf"


async def test_sane_replies_fire_no_madness(tokenizer):
    engine = ScriptedEngine([CALL_1, CALL_2, FINAL], tokenizer=tokenizer)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        await tool_conversation(channel)
    assert channel.madness == [] and channel.metrics()["tool_call_errors"] == 0


async def test_concurrent_calls_of_one_agent_do_not_corrupt_samples(tokenizer):
    engine = ScriptedEngine(["A.", "B."], tokenizer=tokenizer, delay=0.05)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = client_for(channel)
        messages = [{"role": "user", "content": "Hi"}]
        await asyncio.gather(ask(client, messages), ask(client, [*messages, {"role": "user", "content": "x"}]))
    samples = channel.samples()
    assert len(samples) == 2 and all(sample.num_calls == 1 for sample in samples)
    for sample, prompt in zip(samples, engine.prompts, strict=True):
        assert sample.prompt_ids == prompt


async def test_overlapping_continuations_extend_once_and_count_the_other(tokenizer):
    """An agent that forks: two calls continue the same reply at once. The first continues the
    sample; the second (started while the first ran) becomes its own sample."""
    engine = ScriptedEngine(["Hi.", "Fork A.", "Fork B."], tokenizer=tokenizer, delay=0.05)
    async with running_gateway(engine, http=False) as gateway:
        channel = gateway.open_episode("e1")
        client = client_for(channel)
        messages = [{"role": "user", "content": "Hi"}]
        messages.append(await ask(client, messages))
        await asyncio.gather(ask(client, [*messages, {"role": "user", "content": "A"}]),
                             ask(client, [*messages, {"role": "user", "content": "B"}]))
    first, second = channel.samples()
    assert (first.num_calls, second.num_calls) == (2, 1)
    assert channel.metrics()["merge_break/concurrent_call"] == 1
    assert engine.prompts[1] == first.prompt_ids + first.response_ids[: len(engine.prompts[1]) - len(first.prompt_ids)]
    assert second.prompt_ids == engine.prompts[2]


def test_sync_client_through_the_in_process_transport_from_a_thread(tokenizer):
    engine = ScriptedEngine(["Hello from a thread."], tokenizer=tokenizer)

    async def main():
        async with running_gateway(engine, http=False) as gateway:
            channel = gateway.open_episode("e1")

            def workflow():
                client = openai.OpenAI(base_url="http://gateway.invalid/v1", api_key=channel.api_key(),
                                       http_client=httpx.Client(transport=channel.transport()), max_retries=0)
                return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])

            response = await asyncio.to_thread(workflow)
            assert response.choices[0].message.content == "Hello from a thread."
            inside = httpx.Client(transport=channel.transport(), base_url="http://gateway.invalid")
            with pytest.raises(RuntimeError, match="async client"):
                inside.get("/health")
            return channel

    channel = asyncio.run(main())
    assert channel.samples()[0].num_calls == 1
