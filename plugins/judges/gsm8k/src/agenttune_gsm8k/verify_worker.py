"""The math-verify worker process: one JSON request per line in, one JSON verdict per line out.

Run by `MathVerifier` as `python -m agenttune_gsm8k.verify_worker [MEMORY_MB]`; with MEMORY_MB, a
comparison that would need more memory than that fails with MemoryError (an undecided verdict). It lives in its own process
because math-verify (sympy underneath) can run for hours on a pathological answer such as
`\\boxed{9^{9^{9^9}}}`, and only a process can be stopped from outside. math-verify's own timeouts
use `signal.alarm`, which works in no thread but the main one, so they are turned off here
(`parsing_timeout=None`, `timeout_seconds=None`) and the parent enforces the limit instead.

Protocol: the worker prints `{"ready": true}` once math-verify is imported (or `{"ready": false,
"error": ...}` and exits), then answers each
`{"gold": str, "answer": str}` line with `{"equal": bool | null, "reason": str, "gold": str,
"answer": str}` (null when it could not decide: nothing parsed, or an error).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


def compare(gold: str, answer: str) -> dict[str, Any]:
    from math_verify import parse, verify

    gold_parsed = parse(gold, parsing_timeout=None) or parse(f"${gold}$", parsing_timeout=None)
    answer_parsed = parse(answer, parsing_timeout=None)
    shown = {"gold": _shown(gold_parsed), "answer": _shown(answer_parsed)}
    if not gold_parsed:
        return {"equal": None, "reason": "math-verify could not parse the ground truth", **shown}
    if not answer_parsed:
        return {"equal": None, "reason": "math-verify found no answer in the text", **shown}
    return {"equal": bool(verify(gold_parsed, answer_parsed, timeout_seconds=None)), "reason": "math-verify",
            **shown}


def _shown(parsed: list[Any]) -> str:
    return str(parsed[-1]) if parsed else ""


def limit_memory(megabytes: int) -> None:
    """Cap the address space at what is mapped now (math-verify imported) + `megabytes`: a comparison
    that would need more raises MemoryError here (an undecided verdict) instead of swapping the machine."""
    import resource

    with open("/proc/self/statm") as statm:  # Linux; elsewhere the limit is skipped
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    cap = mapped + megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def main() -> None:
    # Its warning that timeouts are off is expected here: the parent process enforces them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        import math_verify  # noqa: F401  (fail now, before announcing readiness)
    except ImportError as error:
        print(json.dumps({"ready": False, "error": f"{type(error).__name__}: {error}"}), flush=True)
        return
    if len(sys.argv) > 1:
        try:
            limit_memory(int(sys.argv[1]))
        except (OSError, ValueError):
            pass
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = compare(str(request["gold"]), str(request["answer"]))
        except MemoryError:
            reply = {"equal": None, "reason": "math-verify ran out of memory (judge option verify_memory_mb)"}
        except Exception as error:  # a bad comparison must not end the worker
            reply = {"equal": None, "reason": f"math-verify failed: {type(error).__name__}: {error}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
