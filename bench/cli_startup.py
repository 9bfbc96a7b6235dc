"""How long the CLI takes to start with every plugin installed, against `python -c "import typer"`.

Installs the plugins that are not in this environment (agentscope, aworld, verl, trinity; without
their heavy dependencies, which registering a plugin must not need) into a cached directory that is
put on PYTHONPATH, so this environment itself is left as it is. Each command runs `--repeat` times in
a fresh interpreter; the table shows the median and the best wall time.

    python bench/cli_startup.py
    python bench/cli_startup.py --repeat 20

Target: `agenttune --help` and `agenttune plugins list` under 0.5 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ["plugins/agentscope", "plugins/aworld", "plugins/verl", "plugins/trinity", "plugins/judges/gsm8k",
           "plugins/envservice", "plugins/openenv"]
TARGET_S = 0.5


def installed_distributions() -> set[str]:
    from importlib.metadata import distributions

    return {dist.metadata["Name"].lower().replace("_", "-") for dist in distributions()}


def plugin_name(path: str) -> str:
    import tomllib

    return tomllib.loads((ROOT / path / "pyproject.toml").read_text())["project"]["name"].lower()


def plugin_dir() -> Path:
    """A directory holding the plugins missing from this environment (built once per source version)."""
    missing = [path for path in PLUGINS if plugin_name(path) not in installed_distributions()]
    digest = hashlib.sha256()
    for path in missing:
        for file in sorted((ROOT / path).rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts and ".pytest_cache" not in file.parts:
                digest.update(str(file.relative_to(ROOT)).encode() + file.read_bytes())
    target = Path(tempfile.gettempdir()) / "agenttune-bench-plugins" / digest.hexdigest()[:16]
    if missing and not target.exists():
        staging = target.with_suffix(".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        print(f"installing {', '.join(missing)} (no dependencies) into {target} ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging),
                        *(str(ROOT / path) for path in missing)], check=True)
        staging.rename(target)
    return target


def timed(command: list[str], env: dict[str, str], repeat: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system) of each run."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    extra = plugin_dir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(extra), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "120"}
    listing = subprocess.run([sys.executable, "-m", "agenttune", "plugins", "list", "--json"], env=env,
                             capture_output=True, text=True, check=True).stdout
    plugins = sorted(plugin["name"] for plugin in json.loads(listing))
    agenttune = str(Path(sys.executable).with_name("agenttune"))
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import typer"': [sys.executable, "-c", "import typer"],
        "agenttune --help": [agenttune, "--help"],
        "agenttune plugins list": [agenttune, "plugins", "list"],
    }
    print(f"plugins registered: {', '.join(plugins)}; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; {args.repeat} runs each")
    results = {}
    for name, command in commands.items():
        timed(command, env, 1)  # warm the file cache
        results[name] = timed(command, env, args.repeat)
    baseline = statistics.median(results['python -c "import typer"'][0])
    cpu_baseline = statistics.median(results['python -c "import typer"'][1])
    print(f"{'command':28s} {'median s':>9s} {'best s':>8s} {'CPU s':>7s} {'median / import typer':>22s} "
          f"{'CPU / import typer':>19s}")
    for name, (walls, cpus) in results.items():
        print(f"{name:28s} {statistics.median(walls):9.3f} {min(walls):8.3f} {statistics.median(cpus):7.3f} "
              f"{statistics.median(walls) / baseline:22.2f} {statistics.median(cpus) / cpu_baseline:19.2f}")
    for name in ("agenttune --help", "agenttune plugins list"):
        median = statistics.median(results[name][0])
        print(f"target {name} < {TARGET_S} s: median {median:.3f} s -> {'met' if median < TARGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()
