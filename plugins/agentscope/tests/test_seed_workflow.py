"""The tutorial's math workflow, as its users wrote it for ASTuner, runs and is judged."""

from __future__ import annotations

import json

from conftest import frameworks, make_config, only_agentscope1

from agenttune import Task
from agenttune.plugin_api import EpisodeStatus, RolloutEngine, ScriptedEngine, get_component

pytestmark = only_agentscope1


CALL = "<tool_call>\n" + json.dumps({"name": "execute_python_code",
                                     "arguments": {"code": "print(48 / 2 + 48)"}}) + "\n</tool_call>"
TASK = Task(task_id="gsm8k-0", query="Natalia sold clips to 48 of her friends in April, and then she sold "
            "half as many clips in May. How many clips did Natalia sell altogether in April and May?",
            metadata={"ground_truth": "72"})


async def run_seed_workflow(config, engine, tiny_tokenizer, tmp_path):
    """One episode of the seed's math workflow through a real gateway, judged by the math judge."""
    from seed_math_workflow import MathAgentWorkflow

    from agenttune.plugin_api import Gateway

    judge_cls = get_component("judges", "math")
    gateway = Gateway(engine, tiny_tokenizer, config)
    await gateway.start()
    try:
        rollout = RolloutEngine(config, gateway, MathAgentWorkflow, judge_cls(judge_cls.Options()),
                                frameworks=frameworks(tmp_path))
        [episode] = await rollout.run_tasks([TASK])
    finally:
        await gateway.stop()
    return episode


async def test_the_seed_math_workflow_runs_unchanged(tiny_tokenizer, tmp_path):
    engine = ScriptedEngine([CALL, "Natalia sold \\boxed{72} clips."], tokenizer=tiny_tokenizer)
    episode = await run_seed_workflow(make_config(rollout={"num_repeat": 1}), engine, tiny_tokenizer, tmp_path)

    assert episode.status is EpisodeStatus.OK, episode.error
    assert (episode.reward, episode.success) == (1.0, True)
    tool_results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert len(tool_results) == 1 and "<stdout>72.0\n</stdout>" in tool_results[0]  # AgentScope's own tool ran
    [sample] = episode.samples
    assert (sample.agent, sample.num_calls) == ("math_react_agent", 2)


async def test_an_agent_that_outgrows_the_context_ends_cleanly_with_its_samples(tiny_tokenizer, tmp_path):
    """Issue 24: AgentScope 1.x lets the gateway's 400 context_length_exceeded propagate out of the agent.
    The episode ends with status context_overflow (not workflow_error), its first call kept as a sample,
    scored by the configured reward."""
    probe = ScriptedEngine([CALL, "Natalia sold \\boxed{72} clips."], tokenizer=tiny_tokenizer)
    await run_seed_workflow(make_config(rollout={"num_repeat": 1}), probe, tiny_tokenizer, tmp_path)
    first, second = (len(prompt) for prompt in probe.prompts)
    budget = 256  # rollout.max_response_length_in_one_turn in make_config
    config = make_config(rollout={"num_repeat": 1, "context_overflow_reward": -1.0},
                         model={"max_model_len": (first + second) // 2 + budget})  # the second call no longer fits

    episode = await run_seed_workflow(config, ScriptedEngine([CALL, "never generated"], tokenizer=tiny_tokenizer),
                                      tiny_tokenizer, tmp_path)

    assert episode.status is EpisodeStatus.CONTEXT_OVERFLOW, episode.error
    assert "context length" in episode.error and episode.reward == -1.0
    [sample] = episode.samples
    assert sample.num_calls == 1 and sample.num_trained_tokens > 0  # the tool call is kept for training
    assert episode.metrics["context_overflow"] == 1
