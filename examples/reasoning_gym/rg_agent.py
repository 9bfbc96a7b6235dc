"""A reasoning-gym agent: one chat call with reasoning-gym's own system prompt, the reply to the judge.

Any reasoning-gym generator fits this shape: the question is the user message, and the model answers
in `<answer>...</answer>` tags (reasoning-gym's "default" system prompt asks for them). The
`reasoning_gym` judge takes the answer out of the tags and scores it with the generator's
`score_answer`.
"""

from __future__ import annotations

import openai

from agenttune import Task, Workflow, WorkflowOutput
from agenttune.workflow.tuner import ModelTuner

# reasoning_gym.utils.SYSTEM_PROMPTS["default"] (0.1.25), copied so that this module imports nothing heavy.
SYSTEM_PROMPT = """Given a problem, your task is to answer the question by thinking step-by-step in a clear and specific manner.
Once you have thought about the reasoning process, provide the answer in the following format:
<answer>answer here</answer>
Do not explain your reasoning inside the answer tags, provide only the final answer. When an example is provided, you should strictly follow the format of the output/answer in that example.
"""


class ReasoningGymAgent(Workflow):
    async def execute(self, task: Task, tuner: ModelTuner) -> WorkflowOutput:
        client = tuner.as_async_openai_client()
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.query}]
        try:
            # no max_tokens: the gateway caps a reply at rollout.max_response_length_in_one_turn
            response = await client.chat.completions.create(model=tuner.model_name, messages=messages)
        except openai.BadRequestError as error:
            if error.code != "context_length_exceeded":
                raise
            return WorkflowOutput(metadata={"final_answer": ""})  # the question alone fills the context
        reply = response.choices[0].message.content or ""
        tuner.update_judge_input_dictionary(final_answer=reply)
        return WorkflowOutput(metadata={"final_answer": reply})
