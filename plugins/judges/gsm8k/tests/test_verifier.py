"""math-verify in worker processes: right verdicts, a hard time limit, safe from threads and async code."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from agenttune_gsm8k.verifier import MathVerifier

# sympy would compute this for hours: 9^(9^(9^9)).
PATHOLOGICAL = r"The answer is \boxed{9^{9^{9^{9}}}}"


@pytest.fixture(scope="module")
def verifier() -> Iterator[MathVerifier]:
    with MathVerifier(timeout=3.0, max_workers=2) as shared:
        yield shared


@pytest.mark.parametrize(("gold", "answer", "equal"), [
    ("72", "Natalia sold 48 + 24 = 72 clips.", True),
    ("1234", "She has $1,234 left.", True),
    ("0.5", r"\boxed{0.50}", True),
    ("10", "She earned $10.00.", True),
    ("72", "First 48, then 24, so 70 in total.", False),
    ("3/4", r"\boxed{\frac{3}{4}}", True),
])
def test_verdicts(verifier: MathVerifier, gold: str, answer: str, equal: bool) -> None:
    verdict = verifier.compare(gold, answer)
    assert verdict.equal is equal, verdict
    assert verdict.reason == "math-verify"


def test_no_number_is_undecided(verifier: MathVerifier) -> None:
    verdict = verifier.compare("72", "I do not know.")
    assert verdict.equal is None
    assert "no answer" in verdict.reason


def test_a_pathological_answer_is_stopped_and_the_next_one_still_works() -> None:
    with MathVerifier(timeout=1.0, max_workers=1) as verifier:
        assert verifier.compare("72", "72").equal is True  # the worker is up
        stuck = verifier.compare("72", PATHOLOGICAL)
        assert stuck.equal is None
        assert "stopped after" in stuck.reason
        assert verifier.timeouts == 1
        assert verifier.compare("72", r"\boxed{72}").equal is True  # a fresh worker took over


def test_the_workers_memory_cap_turns_a_huge_allocation_into_memory_error() -> None:
    # No answer we found makes math-verify itself allocate gigabytes quickly (sympy keeps 2^(2^31)
    # symbolic), so the cap the worker applies is checked with an allocation of its own.
    code = ("from agenttune_gsm8k.verify_worker import limit_memory\nlimit_memory(64)\nbytearray(32 << 20)\n"
            "print('32 MB fit')\nbytearray(512 << 20)\nprint('512 MB fit')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "32 MB fit" in result.stdout and "512 MB fit" not in result.stdout
    assert "MemoryError" in result.stderr
    with MathVerifier(timeout=5.0, max_workers=1, memory_mb=128) as verifier:
        assert verifier.compare("72", r"\boxed{72}").equal is True  # math-verify works under its cap
        assert verifier._idle.get().process.args[-1] == "128"


def test_concurrent_calls_from_threads(verifier: MathVerifier) -> None:
    results: dict[int, bool | None] = {}

    def check(n: int) -> None:
        results[n] = verifier.compare(str(n), f"The result is {n}.").equal

    threads = [threading.Thread(target=check, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {n: True for n in range(6)}


async def test_usable_from_async_code(verifier: MathVerifier) -> None:
    # math-verify's own signal.alarm timeouts would raise here (not the main thread); ours do not.
    verdicts = await asyncio.gather(*(asyncio.to_thread(verifier.compare, "5", r"\boxed{5}") for _ in range(3)))
    assert [verdict.equal for verdict in verdicts] == [True, True, True]


def test_missing_math_verify_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # A `math_verify` package that fails to import, first on the worker's path.
    fake = tmp_path / "math_verify"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('math_verify is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with MathVerifier(timeout=1.0) as verifier:
        verdict = verifier.compare("1", "1")
    assert verdict.equal is None
    assert "math-verify is unavailable" in verdict.reason and "broken here" in verdict.reason
