"""The tutorial's math workflow, as its users wrote it for ASTuner, runs and is judged."""

from __future__ import annotations

import json

from conftest import frameworks, make_config, only_agentscope1

from agenttune import Task
from agenttune.plugin_api import EpisodeStatus, RolloutEngine, ScriptedEngine, get_component

pytestmark = only_agentscope1


async def test_the_seed_math_workflow_runs_unchanged(tiny_tokenizer, tmp_path):
    from seed_math_workflow import MathAgentWorkflow

    from agenttune.plugin_api import Gateway

    call = "<tool_call>\n" + json.dumps({"name": "execute_python_code",
                                         "arguments": {"code": "print(48 / 2 + 48)"}}) + "\n</tool_call>"
    engine = ScriptedEngine([call, "Natalia sold \\boxed{72} clips."], tokenizer=tiny_tokenizer)
    config = make_config(rollout={"num_repeat": 1})
    task = Task(task_id="gsm8k-0", query="Natalia sold clips to 48 of her friends in April, and then she sold "
                "half as many clips in May. How many clips did Natalia sell altogether in April and May?",
                metadata={"ground_truth": "72"})
    judge_cls = get_component("judges", "math")
    gateway = Gateway(engine, tiny_tokenizer, config)
    await gateway.start()
    try:
        rollout = RolloutEngine(config, gateway, MathAgentWorkflow, judge_cls(judge_cls.Options()),
                                frameworks=frameworks(tmp_path))
        [episode] = await rollout.run_tasks([task])
    finally:
        await gateway.stop()

    assert episode.status is EpisodeStatus.OK, episode.error
    assert (episode.reward, episode.success) == (1.0, True)
    tool_results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert len(tool_results) == 1 and "<stdout>72.0\n</stdout>" in tool_results[0]  # AgentScope's own tool ran
    [sample] = episode.samples
    assert (sample.agent, sample.num_calls) == ("math_react_agent", 2)
