"""agenttune-plugin-gsm8k: judges for math answers.

    judge: {type: math}            # alias: gsm8k
    judge: {type: math_and_llm, llm: {base_url: ..., model: ...}}

GSM8K rows (`question`, `answer` ending in `#### 72`) need no column settings: the core readers'
`gsm8k` preset maps them (`task_reader: {type: huggingface, dataset_path: openai/gsm8k}`).
"""

from agenttune_gsm8k.answers import ground_truth, same_answer, strict_answer
from agenttune_gsm8k.judges import GSM8KJudge, MathAndLLMJudge, MathJudge
from agenttune_gsm8k.verifier import MathVerifier, Verdict

__all__ = ["GSM8KJudge", "MathAndLLMJudge", "MathJudge", "MathVerifier", "Verdict", "ground_truth",
           "same_answer", "strict_answer"]
