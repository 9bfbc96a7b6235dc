"""How long `agenttune config check` takes against the start of a run of the same config.

Runs, alternately and `--repeat` times each, in the config's directory (as a user would):

    agenttune config check --conf CONF
    agenttune train --conf CONF --backbone debug --run-dir <temporary>

and reports the median wall time of `config check`, of `train` until its first rollout starts (the
"Rolling out" line: the config checked, the model's tokenizer and the engine loaded, the gateway up)
and of the whole debug run, with the ratio check / train start and the load average before and after.

    python bench/config_check.py
    python bench/config_check.py --conf tests/config/bad_configs/valid.yaml --repeat 5

Target: `config check` well under a run's start (docs/reliability.md, "Bad configuration").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONF = ROOT / "tests" / "config" / "bad_configs" / "valid.yaml"
STARTED = "Rolling out"


def time_check(conf: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agenttune", "config", "check", "--conf", conf.name], cwd=conf.parent,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def time_train(conf: Path) -> tuple[float, float]:
    """Seconds until the first rollout starts, and until the run ends."""
    with tempfile.TemporaryDirectory(prefix="agenttune-bench-check-") as run_dir:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "agenttune", "train", "--conf", conf.name, "--backbone",
                                    "debug", "--run-dir", str(Path(run_dir) / "run")], cwd=conf.parent,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert process.stdout is not None
        rolling = None
        for line in process.stdout:
            if rolling is None and STARTED in line:
                rolling = time.perf_counter() - started
        if process.wait() != 0 or rolling is None:
            raise SystemExit(f"`agenttune train --conf {conf}` failed or printed no {STARTED!r} line")
        return rolling, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", type=Path, default=DEFAULT_CONF)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    conf = args.conf.resolve()
    load_before = os.getloadavg()
    time_check(conf)  # warm the file cache (and build tiny://default once)
    checks, starts, totals = [], [], []
    for _ in range(args.repeat):
        checks.append(time_check(conf))
        start, total = time_train(conf)
        starts.append(start)
        totals.append(total)
    load_after = os.getloadavg()
    check, start = statistics.median(checks), statistics.median(starts)
    print(f"{conf.name}: {args.repeat} runs each, alternating; {os.cpu_count()} cores, load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'command':44s} {'median s':>9s} {'runs s':>24s}")
    for name, values in [("agenttune config check", checks), ("agenttune train (until the first rollout)", starts),
                         ("agenttune train (the whole debug run)", totals)]:
        print(f"{name:44s} {statistics.median(values):9.2f} {' '.join(f'{value:.2f}' for value in values):>24s}")
    print(f"config check / train start: {check / start:.2f}")


if __name__ == "__main__":
    main()
