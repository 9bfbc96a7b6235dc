"""`llm_judge`: another model grades the episode against a rubric.

The judge renders a rubric prompt (a Jinja template) with the task, the agent's answer, the reference
answer and the conversation, sends it to an OpenAI-compatible `/chat/completions` endpoint, and
reads a score out of the reply ("Score: 7"). The score is mapped onto [0, 1] and becomes the reward.

Failures are expected (the judge model is down, slow, or rambles without a score): each request
times out, is retried with backoff, and when every attempt failed the judgement is marked failed.
With `on_failure: exclude` (the default) the episode gets status `judge_error` and is left out of
training; with `on_failure: reward` it gets `failure_reward` and `details.judge_failed = true`.
The run goes on either way.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agenttune.components.judges.base import Judge, JudgeInput, JudgeResult
from agenttune.errors import UserError

if TYPE_CHECKING:
    import httpx

# httpx, the retry helpers and the run's logging are imported where they are used: registering
# this judge (which every `agenttune` command does, `--help` included) must stay cheap.

DEFAULT_SYSTEM_PROMPT = "You are a strict, fair grader of an AI agent's work. Follow the rubric exactly."

DEFAULT_TEMPLATE = """\
Grade the agent's answer to the task below.

## Task
{{ query }}
{% if reference %}
## Reference answer
{{ reference }}
{% endif %}
## Agent's answer
{{ answer }}

Judge correctness first, then the soundness of the reasoning. Write at most three sentences of \
justification, then end with one line of the form "Score: N", where N is an integer from \
{{ min_score }} (wrong or empty) to {{ max_score }} (correct, with sound reasoning).
"""

TEMPLATE_FIELDS = ("query", "answer", "reference", "transcript", "task_id", "metadata", "min_score", "max_score")


class LLMJudgeError(RuntimeError):
    """The judge model gave no usable score after every attempt."""


class _Retryable(Exception):
    """One attempt failed in a way another attempt may not."""


class LLMJudgeOptions(BaseModel):
    """Options of the `llm_judge` judge (the keys of the `judge:` section besides `type`)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible base URL (ending in /v1). Default: $AGENTTUNE_JUDGE_BASE_URL, "
                    "then $OPENAI_BASE_URL.")
    model: str | None = Field(default=None, description="Judge model name. Default: $AGENTTUNE_JUDGE_MODEL.")
    api_key: str | None = Field(
        default=None, description="API key. Default: the variable named by api_key_env, then $OPENAI_API_KEY.")
    api_key_env: str = Field(default="AGENTTUNE_JUDGE_API_KEY",
                             description="Environment variable holding the API key (keeps keys out of configs).")
    system_prompt: str = Field(default=DEFAULT_SYSTEM_PROMPT, description="The judge's system message.")
    template: str = Field(
        default=DEFAULT_TEMPLATE,
        description="Jinja template of the rubric prompt. Variables: " + ", ".join(TEMPLATE_FIELDS) + ".")
    template_file: Path | None = Field(default=None, description="Read the template from this file instead.")
    reference_key: str | None = Field(
        default=None,
        description="Task metadata key of the reference answer. Default: ground_truth, else answer, else none.")
    score_pattern: str = Field(
        default=r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)",
        description="Regular expression (case-insensitive) whose first group is the score; the last match counts.")
    min_score: float = Field(default=0.0, description="Lowest score of the rubric (reward 0).")
    max_score: float = Field(default=10.0, description="Highest score of the rubric (reward 1).")
    success_threshold: float = Field(default=0.7, ge=0, le=1,
                                     description="Normalised score from which the episode counts as solved.")
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature of the judge model.")
    max_tokens: int = Field(default=512, gt=0, description="Most tokens the judge may write.")
    request_timeout: float = Field(default=30.0, gt=0, description="Seconds one request may take.")
    max_retries: int = Field(default=3, ge=0,
                             description="Further attempts after a failed one (errors, 5xx, 429, no score).")
    backoff: float = Field(default=1.0, ge=0, description="First wait between attempts, doubled each time (s).")
    on_failure: Literal["exclude", "reward"] = Field(
        default="exclude",
        description="When no score could be had: exclude the episode from training (status judge_error), "
                    "or give it failure_reward.")
    failure_reward: float = Field(default=0.0, description="Reward for a failed judgement with on_failure: reward.")
    extra_body: dict[str, Any] = Field(default_factory=dict,
                                       description="Extra fields for the request body (e.g. top_p, seed).")

    @field_validator("score_pattern")
    @classmethod
    def _one_group(cls, pattern: str) -> str:
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise ValueError(f"not a regular expression: {error}") from error
        if compiled.groups < 1:
            raise ValueError("needs a capturing group around the number, e.g. 'score: (\\d+)'")
        return pattern

    @model_validator(mode="after")
    def _consistent(self) -> LLMJudgeOptions:
        if self.max_score <= self.min_score:
            raise ValueError(f"max_score ({self.max_score}) must be above min_score ({self.min_score})")
        if self.template_file is not None:
            try:
                self.template = self.template_file.read_text(encoding="utf-8")
            except OSError as error:
                raise ValueError(f"cannot read template_file {str(self.template_file)!r}: {error}") from error
        compile_template(self.template)
        return self


def compile_template(text: str) -> Any:
    """The Jinja template, failing on syntax errors and on variables it does not know."""
    import jinja2
    import jinja2.meta

    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
    try:
        unknown = sorted(jinja2.meta.find_undeclared_variables(environment.parse(text)) - set(TEMPLATE_FIELDS))
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"the rubric template is not valid Jinja: {error} (line {error.lineno})") from error
    if unknown:
        raise ValueError(f"the rubric template uses unknown variable(s) {', '.join(unknown)}; "
                         f"known: {', '.join(TEMPLATE_FIELDS)}")
    return environment.from_string(text)


class LLMJudge(Judge):
    """Scores an episode by asking another model to grade it against a rubric."""

    name = "llm_judge"
    isolation = "loop"  # it only awaits HTTP calls (bounded by request_timeout)
    Options = LLMJudgeOptions

    def __init__(self, options: LLMJudgeOptions | None = None):
        from agenttune.web.http_retry import RetryPolicy

        super().__init__(options)
        self.options: LLMJudgeOptions
        self.endpoint = resolve_endpoint(self.options)
        self.template = compile_template(self.options.template)
        self.pattern = re.compile(self.options.score_pattern, re.IGNORECASE)
        self.policy = RetryPolicy(attempts=self.options.max_retries + 1, backoff=self.options.backoff)

    async def judge(self, judge_input: JudgeInput) -> JudgeResult:
        try:
            score, reply, attempts = await self.grade(self.prompt(judge_input))
        except LLMJudgeError as error:
            if self.options.on_failure == "exclude":
                raise
            from agenttune.config.run import get_logger

            get_logger("judges.llm_judge").warning("llm judge failed; giving the failure reward", error=str(error))
            return JudgeResult(reward=self.options.failure_reward, success=False,
                               details={"judge_failed": True, "judge_error": str(error)})
        reward = self.normalise(score)
        return JudgeResult(
            reward=reward,
            success=reward >= self.options.success_threshold,
            details={"llm_score": score, "llm_reply": reply, "llm_attempts": attempts},
        )

    def prompt(self, judge_input: JudgeInput) -> list[dict[str, str]]:
        task = judge_input.task
        answer = judge_input.final_answer
        user = self.template.render(
            query=task.query,
            answer=judge_input.last_assistant_text if answer is None else str(answer),
            reference=self.reference(task.metadata),
            transcript=render_transcript(judge_input.messages),
            task_id=task.task_id,
            metadata=task.metadata,
            min_score=_plain_number(self.options.min_score),
            max_score=_plain_number(self.options.max_score),
        )
        return [{"role": "system", "content": self.options.system_prompt}, {"role": "user", "content": user}]

    def reference(self, metadata: dict[str, Any]) -> str:
        keys = [self.options.reference_key] if self.options.reference_key else ["ground_truth", "answer"]
        for key in keys:
            if metadata.get(key) is not None:
                return str(metadata[key])
        return ""

    async def grade(self, messages: list[dict[str, str]]) -> tuple[float, str, int]:
        """(score, the judge's reply, attempts made); LLMJudgeError when no attempt gave a score."""
        import httpx

        body = {"model": self.endpoint.model, "messages": messages, "temperature": self.options.temperature,
                "max_tokens": self.options.max_tokens, **self.options.extra_body}
        problems: list[str] = []
        delays = self.policy.delays()
        async with httpx.AsyncClient(base_url=self.endpoint.base_url, headers=self.endpoint.headers,
                                     timeout=self.options.request_timeout) as client:
            while True:
                try:
                    reply = await self._ask(client, body)
                except _Retryable as problem:
                    problems.append(str(problem))
                else:
                    score = self.parse_score(reply)
                    if score is not None:
                        return score, reply, len(problems) + 1
                    # Sampled again: a second look often follows the rubric.
                    problems.append(f"no score in the reply {_excerpt(reply)!r}")
                delay = next(delays, None)
                if delay is None:
                    raise LLMJudgeError(self._failure_message(problems))
                await asyncio.sleep(delay)

    async def _ask(self, client: httpx.AsyncClient, body: dict[str, Any]) -> str:
        """One request: the reply text. _Retryable when another try may help, LLMJudgeError when not."""
        import httpx

        from agenttune.web.http_retry import should_retry_status

        try:
            response = await client.post("/chat/completions", json=body)
        except httpx.TransportError as error:
            raise _Retryable(f"{type(error).__name__}: {error or 'no answer'}") from error
        if response.status_code != 200:
            problem = f"HTTP {response.status_code}: {_excerpt(response.text)}"
            if should_retry_status(response.status_code, idempotent=True):
                raise _Retryable(problem)
            raise LLMJudgeError(f"the judge model {self.endpoint.model!r} at {self.endpoint.base_url} refused "
                                f"the request ({problem}); check judge.base_url, judge.model and the API key")
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise _Retryable(f"not a chat completion: {_excerpt(response.text)}") from error
        return content if isinstance(content, str) else ""

    def _failure_message(self, problems: list[str]) -> str:
        tries = len(problems)
        return (f"the judge model {self.endpoint.model!r} at {self.endpoint.base_url} gave no usable score "
                f"after {tries} attempt{'s' if tries != 1 else ''}: " + "; ".join(problems[-3:]))

    def parse_score(self, reply: str) -> float | None:
        """The last score the pattern finds (or the whole reply if it is a bare number), within range."""
        matches = self.pattern.findall(reply)
        text = matches[-1] if matches else reply.strip()
        if isinstance(text, tuple):  # several groups: the first is the score
            text = text[0]
        try:
            score = float(text)
        except ValueError:
            return None
        if not self.options.min_score <= score <= self.options.max_score:
            return None
        return score

    def normalise(self, score: float) -> float:
        low, high = self.options.min_score, self.options.max_score
        return (score - low) / (high - low)


class Endpoint(BaseModel):
    base_url: str
    model: str
    headers: dict[str, str]


def resolve_endpoint(options: LLMJudgeOptions) -> Endpoint:
    """Base URL, model and key from the options, else the environment; a UserError when missing."""
    base_url = options.base_url or os.environ.get("AGENTTUNE_JUDGE_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
    model = options.model or os.environ.get("AGENTTUNE_JUDGE_MODEL")
    missing = [name for name, value in (("base_url", base_url), ("model", model)) if not value]
    if missing:
        raise UserError(
            f"The llm_judge judge needs {' and '.join(missing)}: set judge.{missing[0]} in the config"
            f" (or AGENTTUNE_JUDGE_{missing[0].upper()} in the environment).",
            hint="For example judge: {type: llm_judge, base_url: http://127.0.0.1:8000/v1, model: qwen2.5-7b}.",
        )
    assert base_url is not None and model is not None
    if not base_url.startswith(("http://", "https://")):
        raise UserError(f"judge.base_url {base_url!r} is not an http(s) URL.",
                        hint="Give the OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
    key = options.api_key or os.environ.get(options.api_key_env) or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return Endpoint(base_url=base_url.rstrip("/"), model=model, headers=headers)


def render_transcript(messages: list[dict[str, Any]]) -> str:
    """The conversation as plain `role: text` blocks, for rubrics that grade the reasoning."""
    blocks = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # multi-part content: keep the text parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        text = content or ""
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            text += f"\n[tool call] {function.get('name')}({function.get('arguments')})"
        blocks.append(f"{message.get('role', '?')}: {text}".rstrip())
    return "\n\n".join(blocks)


def _plain_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _excerpt(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
