"""Model-written Python cannot hang, exhaust memory or flood a rollout."""

from __future__ import annotations

import asyncio
import time

from agenttune_agentscope.python_sandbox import PythonLimits, run_python

LIMITS = PythonLimits(timeout_s=2, memory_mb=512, file_mb=1, shown_chars=200)


async def test_prints_come_back():
    run = await run_python("print(48 / 2 + 48)", LIMITS)
    assert (run.returncode, run.stdout, run.timed_out) == (0, "72.0\n", False)
    assert run.as_text() == "<returncode>0</returncode><stdout>72.0\n</stdout><stderr></stderr>"


async def test_an_infinite_loop_is_stopped_at_the_timeout():
    started = time.monotonic()
    run = await run_python("while True:\n    pass", LIMITS)
    assert run.timed_out and run.returncode != 0
    assert "TimeoutError" in run.stderr
    assert time.monotonic() - started < LIMITS.timeout_s + 3


async def test_a_huge_allocation_fails_inside_the_child():
    run = await run_python("x = bytearray(16 << 30)\nprint('allocated')", LIMITS)
    assert run.returncode == 1 and "MemoryError" in run.stderr and "allocated" not in run.stdout


async def test_flooding_output_is_cut_off():
    run = await run_python("while True:\n    print('x' * 10000)", LIMITS)
    assert run.returncode != 0 and "OutputLimitError" in run.stderr
    assert len(run.stdout) < 300


async def test_the_traceback_shows_only_the_models_code():
    run = await run_python("def f():\n    raise ValueError('boom')\nf()", LIMITS)
    assert run.returncode == 1
    assert run.stderr.startswith("Traceback") and 'File "main.py", line 2, in f' in run.stderr
    assert "runpy" not in run.stderr


async def test_background_children_are_killed_with_the_run(tmp_path):
    marker = tmp_path / "alive"
    child = f"import time, pathlib; time.sleep(1.5); pathlib.Path({str(marker)!r}).write_text('still here')"
    code = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\nprint('started')"
    run = await run_python(code, LIMITS)
    assert run.stdout == "started\n", run.stderr
    await asyncio.sleep(2.5)
    assert not marker.exists()


async def test_a_grandchild_in_a_new_session_is_killed_with_the_run(tmp_path):
    """The code's child starts a grandchild with setsid and exits: the grandchild is orphaned outside the
    process group; the sandbox (a subreaper) adopts it and kills it when the code ends."""
    marker, pid_file = tmp_path / "alive", tmp_path / "grandchild.pid"
    grandchild = f"import time, pathlib; time.sleep(1.5); pathlib.Path({str(marker)!r}).write_text('escaped')"
    starter = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {grandchild!r}], "
               f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(p.pid))")
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {starter!r}])\nprint('started')"
    run = await run_python(code, LIMITS)
    assert run.stdout == "started\n", run.stderr
    await asyncio.sleep(2.5)
    assert pid_file.exists() and not marker.exists()


async def test_a_setsid_grandchild_of_code_that_hangs_is_killed_at_the_timeout(tmp_path):
    marker = tmp_path / "alive"
    grandchild = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('escaped')"
    code = (f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {grandchild!r}], "
            f"start_new_session=True)\ntime.sleep(60)")
    run = await run_python(code, LIMITS)
    assert run.timed_out
    await asyncio.sleep(3.5)
    assert not marker.exists()


async def test_runs_are_independent_and_concurrent():
    runs = await asyncio.gather(*(run_python(f"print({i} * {i})", LIMITS) for i in range(6)))
    assert [run.stdout for run in runs] == [f"{i * i}\n" for i in range(6)]
