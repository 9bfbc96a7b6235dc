"""The rollout hot path's speed-ups change nothing but speed.

- Chat templates render in a sandbox with a fast path for plain dicts and `loop`: its output, its
  undefined values and its security refusals are those of Jinja's own ImmutableSandboxedEnvironment.
- `rollout_gc()` freezes the heap and raises the young-generation threshold only while batches run,
  and puts everything back (bench/rollout_concurrency.py measures what it saves).
- Completion and tool-call ids come from a private generator: unique, and not repeated by a
  workflow's `random.seed()`.
"""

from __future__ import annotations

import gc
import random

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.components.engines.scripted import ScriptedEngine
from agenttune.gateway.rendering import _compile
from agenttune.rollout.gc import YOUNG_THRESHOLD, rollout_gc
from agenttune.rollout.rollout_engine import RolloutEngine
from agenttune.testing import tiny_tokenizer
from agenttune.testing.gateways import running_gateway, tiny_config
from agenttune.web.ids import random_id

TEMPLATE = """\
{%- for message in messages -%}
[{{ loop.index0 }}/{{ loop.length }}{{ ' first' if loop.first }}{{ ' last' if loop.last }} {{ loop.cycle('a', 'b') }}]
{{- message.role }}: {{ message.content or '' }}
{%- if message.name is defined %} ({{ message.name }}){% endif %}
{%- if message.missing is undefined %} -{% endif %}
{{- ' ' ~ (message.tool_calls or []) | length }} {{ message.get('role') }} {{ message['role'] }}
{{- ' ' ~ (message.items() | list | length) }} {{ message.keys | string | truncate(20) }}
{%- for call in message.tool_calls or [] %} {{ call.function.name }}{{ call.function.arguments | tojson }}{% endfor %}
{% endfor -%}
{{ tools | tojson if tools }}"""

MESSAGES = [
    {"role": "system", "content": "Be brief.", "name": "policy"},
    {"role": "user", "content": "2+2?", "items": "a key named like a dict method"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": {"x": 2}}}]},
    {"role": "tool", "content": "4"},
]
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def stock(source: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = _compile("").environment.filters["tojson"]
    return environment.from_string(source)


def test_templates_render_as_in_jinjas_own_sandbox():
    ours, theirs = _compile(TEMPLATE), stock(TEMPLATE)
    assert type(ours.environment) is not ImmutableSandboxedEnvironment  # the fast path is in use
    for messages in (MESSAGES, MESSAGES[:1], MESSAGES[1:]):
        rendered = ours.render(messages=messages, tools=TOOLS)
        assert rendered == theirs.render(messages=messages, tools=TOOLS)
    rendered = ours.render(messages=MESSAGES, tools=TOOLS)
    assert rendered.startswith("[0/4 first a]system: Be brief. (policy) - 0 system system 3 <built-in method...")
    assert "[2/4 a]assistant:  - 1 assistant assistant 3 <built-in method... calc{\"x\": 2}" in rendered
    assert rendered.count(" - ") == 4  # `message.missing` is undefined in every message


@pytest.mark.parametrize(("source", "allowed"), [
    ("{{ messages[0].__class__ }}", ""),  # an unsafe attribute is undefined: it prints as nothing
    ("{{ messages[0].__class__.__mro__ }}", None),
    ("{% for m in messages %}{{ loop.__class__.__init__.__globals__ }}{% endfor %}", None),
    ("{{ messages[0].update({'role': 'x'}) }}", None),
    ("{{ messages[0].pop('role') }}", None),
    ("{{ messages.append(1) }}", None),
    ("{{ messages[0].content.format(1) }}", "Be brief."),  # the sandbox's safe str.format
])
def test_the_sandbox_refuses_what_jinjas_refuses(source, allowed):
    outcomes = []
    for template in (_compile(source), stock(source)):
        try:
            outcomes.append(template.render(messages=MESSAGES, tools=TOOLS))
        except jinja2.TemplateError as error:  # SecurityError, UndefinedError
            outcomes.append(type(error))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0] == allowed if allowed is not None else issubclass(outcomes[0], jinja2.TemplateError)
    assert MESSAGES[0]["role"] == "system"  # nothing was changed


def test_dict_subclasses_take_the_sandboxs_own_path():
    class Message(dict):
        @property
        def role(self):
            return "from the property"

    source = "{{ message.role }} {{ message.content }}"
    message = Message(role="user", content="hi")
    assert _compile(source).render(message=message) == stock(source).render(message=message) == "from the property hi"


def test_rollout_gc_holds_while_any_batch_runs_and_restores():
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with rollout_gc():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
        with rollout_gc():  # an overlapping batch
            pass
        assert gc.get_freeze_count() > 0  # still held by the outer one
        garbage = []
        garbage.append(garbage)  # a cycle made during the batch is collected as usual
        del garbage
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_rollout_gc_leaves_a_program_s_own_settings_alone():
    before = gc.get_threshold()
    gc.freeze()  # e.g. an inference server that froze its heap after loading
    try:
        frozen = gc.get_freeze_count()
        with rollout_gc():
            gc.set_threshold(1234, 5, 5)  # the program changed them meanwhile
        # Not unfrozen (that empties the permanent generation): it was not ours. Frozen objects can
        # still be freed meanwhile (other threads), so the count may drop a little.
        assert gc.get_freeze_count() > frozen // 2
        assert gc.get_threshold() == (1234, 5, 5)  # not overwritten
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


class Probe(Workflow):
    async def execute(self, task, tuner):
        return WorkflowOutput(reward=1.0, metadata={"frozen": gc.get_freeze_count() > 0,
                                                    "threshold": gc.get_threshold()[0]})


async def test_run_tasks_runs_episodes_under_rollout_gc():
    before = gc.get_threshold()
    tokenizer = tiny_tokenizer()
    async with running_gateway(ScriptedEngine(["hi"], tokenizer=tokenizer, cycle=True), http=False) as gateway:
        episodes = await RolloutEngine(tiny_config(), gateway, Probe).run_tasks([Task(task_id="t", query="q")], 2)
    assert [episode.output for episode in episodes] == [{"frozen": True, "threshold": YOUNG_THRESHOLD}] * 2
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_ids_are_unique_and_ignore_random_seed():
    first = []
    for _ in range(2):
        random.seed(0)  # a workflow seeding the global generator must not make ids repeat
        first.append(random_id("call_"))
    assert first[0] != first[1]
    ids = {random_id("chatcmpl-") for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(len(value) == len("chatcmpl-") + 24 and value.startswith("chatcmpl-") for value in ids)
