"""One episode on a real gateway whose engine plays scripted replies: for agent-framework tests.

    episode = await open_scripted_episode(config, tokenizer, [tool_call, "The answer is 5."],
                                          frameworks=FrameworkLoader(tmp_path))
    model = episode.tuner.as_agentscope_model()      # exactly what a workflow receives
    ...                                              # run the framework's agent on it
    [sample] = episode.channel.samples()
    assert_exact_sample(episode, sample, calls=2)    # the sample holds exactly what was generated
    await episode.aclose()

Replies are text (tokenized, then the end-of-turn token) or token ids, returned as they are, one per
call. `episode.generated` lists them call by call: the truth a sample must hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agenttune.components.engines.base import Generation, SamplingParams
from agenttune.components.engines.scripted import ScriptedEngine, scripted_logprob
from agenttune.config.models import AgentTuneConfig
from agenttune.gateway import EpisodeChannel, Gateway
from agenttune.rollout.framework_loader import FrameworkLoader
from agenttune.workflow.task import Task
from agenttune.workflow.tuner import ModelTuner


@dataclass
class ScriptedEpisode:
    engine: ScriptedEngine
    gateway: Gateway
    channel: EpisodeChannel
    tuner: ModelTuner
    tokenizer: Any
    generated: list[list[int]] = field(default_factory=list)

    def prompt_text(self, index: int) -> str:
        """The prompt of call `index`, as the model saw it."""
        return self.tokenizer.decode(self.engine.prompts[index])

    async def aclose(self) -> None:
        await self.tuner.aclose()
        self.gateway.close_episode(self.channel)
        await self.gateway.stop()


async def open_scripted_episode(config: AgentTuneConfig, tokenizer: Any, replies: list[str | list[int]], *,
                                frameworks: FrameworkLoader, task: Task | None = None, cycle: bool = False,
                                episode_id: str = "episode-0") -> ScriptedEpisode:
    """Start a gateway whose engine answers with `replies` and open one episode on it.

    The engine returns each reply whole (no stop strings, no token budget), so `generated` is exactly
    what the gateway got; a call past the last reply fails, unless `cycle` starts the script again.
    """
    script = [_reply_ids(tokenizer, reply) for reply in replies]
    generated: list[list[int]] = []

    def respond(prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        index = len(generated)
        if index >= len(script) and not cycle:
            raise RuntimeError(f"the script has {len(script)} replies; call {index + 1} was made")
        ids = script[index % len(script)]
        generated.append(ids)
        return Generation(ids, [scripted_logprob(token) for token in ids], "stop")

    engine = ScriptedEngine(tokenizer=tokenizer, responder=respond)
    gateway = Gateway(engine, tokenizer, config)
    await gateway.start()
    channel = gateway.open_episode(episode_id, SamplingParams(max_tokens=256))
    tuner = ModelTuner(channel, task or Task(task_id="t-1", query="What is 2 + 3?"), config, frameworks)
    return ScriptedEpisode(engine, gateway, channel, tuner, tokenizer, generated)


def assert_exact_sample(episode: ScriptedEpisode, sample: Any, calls: int) -> None:
    """The sample is the engine's last prompt plus its last generation, and trains only on generations.

    Every call's prompt extends the previous prompt and generation (that is what merging means), so
    the last prompt + last generation holds every sampled token; the mask is 1 exactly on those, and
    the logprobs under the mask are the engine's, in order.
    """
    prompts = episode.engine.prompts
    assert sample.num_calls == calls
    assert len(prompts) == calls
    full = sample.prompt_ids + sample.response_ids
    assert full == prompts[-1] + episode.generated[-1]
    assert sample.prompt_ids == prompts[0]
    expected_mask = [0] * len(full)
    for prompt, generated in zip(prompts, episode.generated, strict=True):
        assert full[: len(prompt)] == prompt
        assert full[len(prompt): len(prompt) + len(generated)] == generated
        expected_mask[len(prompt): len(prompt) + len(generated)] = [1] * len(generated)
    assert sample.loss_mask == expected_mask[len(sample.prompt_ids):]
    assert sum(sample.loss_mask) == sum(len(ids) for ids in episode.generated)
    trained_logprobs = [logprob for logprob, mask in zip(sample.logprobs, sample.loss_mask, strict=True) if mask]
    assert trained_logprobs == [scripted_logprob(token) for ids in episode.generated for token in ids]


def _reply_ids(tokenizer: Any, reply: str | list[int]) -> list[int]:
    if isinstance(reply, list):
        return reply
    return tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
