"""Run model-written Python in a child process that cannot hang or sink a rollout.

The child gets a wall-clock timeout (its whole process tree is killed: it is a child subreaper, so
descendants that start a new session stay in its tree; its process group too), an address-space
limit (a huge allocation raises MemoryError inside the child), a CPU-time backstop and a file-size
limit (runaway printing stops the child instead of filling the disk or the parent's memory).
Whatever the code leaves running in the background ends with it. Output goes
to files in a private temporary directory, which is also the working directory and is removed after.
This protects the rollout from accidents, not from a malicious program: it is not a security sandbox.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

# Applies the limits inside the child, then runs the script: no preexec_fn, which is unsafe in a
# process that has threads (the gateway and engines do).
# A traceback shows the model its own frames only, not the launcher's.
# It makes itself a child subreaper (Linux), so orphans of the code's children are adopted by it and
# not by init, and kills what is left when the code ends.
_LAUNCHER = """\
import ctypes, resource, runpy, sys, traceback
import psutil
try:
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except (OSError, AttributeError):
    pass
memory, file_size, cpu = (int(value) for value in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
sys.argv = sys.argv[4:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    raise
except BaseException as error:
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != sys.argv[0]:
        frames = frames.tb_next
    traceback.print_exception(type(error), error, frames)
    sys.exit(1)
finally:
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
"""


@dataclass(frozen=True)
class PythonLimits:
    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_mb: int = 1
    shown_chars: int = 4000  # of stdout and of stderr, what the model gets back


@dataclass(frozen=True)
class PythonRun:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    def as_text(self) -> str:
        """The tool result in the shape AgentScope's own `execute_python_code` uses."""
        return (f"<returncode>{self.returncode}</returncode><stdout>{self.stdout}</stdout>"
                f"<stderr>{self.stderr}</stderr>")


async def run_python(code: str, limits: PythonLimits = PythonLimits()) -> PythonRun:
    with tempfile.TemporaryDirectory(prefix="agenttune-python-") as folder:
        workdir = Path(folder)
        script = workdir / "main.py"
        script.write_text(code, encoding="utf-8")
        with open(workdir / "stdout", "wb") as stdout, open(workdir / "stderr", "wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-c", _LAUNCHER,
                str(limits.memory_mb << 20), str(limits.file_mb << 20), str(math.ceil(limits.timeout_s) + 1),
                script.name,  # relative to cwd: tracebacks read "main.py", the same in every run
                stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=workdir,
                env=_child_env(), start_new_session=True,
            )
            timed_out = False
            try:
                await asyncio.wait_for(process.wait(), timeout=limits.timeout_s)
            except TimeoutError:
                timed_out = True
            finally:
                _kill_group(process.pid)  # also whatever the code started in the background
                returncode = await process.wait()
        out = _read(workdir / "stdout", limits.shown_chars)
        err = _read(workdir / "stderr", limits.shown_chars)
        flooded = (workdir / "stdout").stat().st_size >= limits.file_mb << 20
    explanation = _explain(returncode, timed_out, flooded, limits)
    return PythonRun(returncode, out, err + explanation, timed_out)


def _child_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "LANG", "TMPDIR")}
    # One thread per numeric library: thread pools reserve address space the memory limit counts.
    env.update(PYTHONUTF8="1", PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    return env


def _kill_group(pid: int) -> None:
    """Kill the child's descendants (while it still adopts their orphans), then its process group."""
    try:
        for descendant in psutil.Process(pid).children(recursive=True):
            descendant.kill()
    except psutil.Error:
        pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        data = handle.read(limit * 4 + 4)
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit] + "\n... (output truncated)"


def _explain(returncode: int | None, timed_out: bool, flooded: bool, limits: PythonLimits) -> str:
    if timed_out:
        return f"\nTimeoutError: the code ran longer than {limits.timeout_s:g} seconds and was stopped."
    if flooded:
        return f"\nOutputLimitError: the code printed more than {limits.file_mb} MB and was stopped."
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "\nTimeoutError: the code used too much CPU time and was stopped."
    return ""
