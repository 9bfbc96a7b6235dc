"""Test sessions. Each plugin gets its own virtualenv: their dependencies conflict (see README).

    nox                 every session (what CI runs)
    nox -s tests        the core
    nox -s fast -R      the core without its slow and browser tests (under a minute): while you work
    nox -s verl -R      one plugin, reusing its virtualenv (fast iteration)

On a CPU-only machine torch is installed first from its CPU wheel (`torch==2.13.0`) so that no
session pulls CUDA packages.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

# uv installs a session's packages in seconds where pip takes minutes (eleven sessions install from scratch
# in CI); venv + pip where uv is not installed (`python3 -m pip install nox uv` brings both).
nox.options.default_venv_backend = "uv|venv"
# uv does not read pip's settings: hand it this machine's local wheels (where a GPU-less machine keeps the CPU
# torch wheel), so that `torch==2.13.0` resolves to the same build under both installers.
if "PIP_FIND_LINKS" in os.environ and "UV_FIND_LINKS" not in os.environ:
    os.environ["UV_FIND_LINKS"] = os.environ["PIP_FIND_LINKS"]
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
CPU_TORCH = "torch==2.13.0"
# tests/entrypoints/tinker_cookbook: tinker-cookbook's own loops against the Tinker server. Only the
# tinker_cookbook session installs tinker-cookbook and runs them; the core sessions leave the folder out.
COOKBOOK_TESTS = "tests/entrypoints/tinker_cookbook"
TINKER_COOKBOOK = "tinker-cookbook==0.6.1"
# The plugins' source trees, for import-linter (lint): it reads them without installing them.
PLUGIN_SOURCES = ["plugins/agentscope/src", "plugins/aworld/src", "plugins/envservice/src", "plugins/judges/gsm8k/src",
                  "plugins/openenv/src", "plugins/reasoning_gym/src", "plugins/trinity/src", "plugins/verl/src",
                  "plugins/verifiers/src"]
MYPY = "mypy==2.4.1"  # a new mypy finds new things: upgrade it on purpose, with the fixes
IMPORT_LINTER = "import-linter==2.17"  # lint-imports: the contracts in [tool.importlinter]


def install_core(session: nox.Session, *extras: str) -> None:
    session.install(CPU_TORCH)
    spec = f".[{','.join(('dev', *extras))}]"
    session.install("-e", spec)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The core: plugin system, config, CLI, gateway, rollouts, the debug and local backbones."""
    # guided: the hf engine's tool_choice/response_format tests; tinker: tests/entrypoints/tinker's SDK
    install_core(session, "local", "guided", "tinker")
    session.run("pytest", "tests", f"--ignore={COOKBOOK_TESTS}", *session.posargs)


@nox.session(python=PYTHON, default=False)
def fast(session: nox.Session) -> None:
    """The core's quick tests: not `slow` (end-to-end runs, worker processes, fuzzing, installs), not `browser`."""
    install_core(session, "local", "guided", "tinker")
    session.install("pytest-xdist>=3.5")
    session.run("pytest", "tests", f"--ignore={COOKBOOK_TESTS}", "-m", "not slow and not browser", "-n", "2",
                *session.posargs)


@nox.session(python=PYTHON)
def tinker_cookbook(session: nox.Session) -> None:
    """tinker-cookbook 0.6.1's RL and supervised loops (rl.train, supervised.train), with an environment
    and a dataset of the tests' own, learning through `agenttune tinker serve` on the tiny model
    (docs/tinker.md)."""
    install_core(session, "local", "tinker")
    # --no-deps: tinker-cookbook 0.6.1 requires tml-renderers>=0.4.1, which PyPI does not have (0.2.1 is its
    # newest). The cookbook imports tml_renderers lazily, only for the Inkling and Kimi K3 tokenizers, which
    # these tests never load; its other requirements are installed by name (agenttune[local,tinker] already
    # brings tinker, transformers, datasets, numpy, pydantic, safetensors, huggingface-hub).
    session.install("--no-deps", TINKER_COOKBOOK)
    session.install(CPU_TORCH, "aiohttp>=3.9.0", "anyio>=4.0.0", "blobfile>=3.0.0", "chz>=0.4.0",
                    "cloudpickle>=3.0.0", "datasets>=2.14.0", "pillow>=10.0.0", "pyrage>=1.4.0",
                    "rich>=13.0.0", "termcolor>=2.0.0", "tiktoken>=0.12.0", "tqdm>=4.60.0")
    session.run("pytest", COOKBOOK_TESTS, *session.posargs)


# Every kind `agenttune plugins new` knows (agenttune/entrypoints/cli/plugin_template.py).
TEMPLATE_KINDS = ("reader", "judge", "framework", "backbone", "engine", "parser")


@nox.session(python=PYTHON)
def plugin_template(session: nox.Session) -> None:
    """The third-party path: `agenttune plugins new` writes a plugin with every kind, pip installs it
    (built by its own [build-system], not editable), then its own tests and a debug training run with
    it, as a plugin author would run them."""
    install_core(session, "local")
    work = Path(session.create_tmp()) / "plugin-template"
    shutil.rmtree(work, ignore_errors=True)
    plugin = work / "agenttune-plugin-noxdemo"
    session.run("agenttune", "plugins", "new", "noxdemo", *[f"--kind={kind}" for kind in TEMPLATE_KINDS],
                "--directory", str(plugin))
    session.install(CPU_TORCH, str(plugin))
    # Listed, from its entry point, and not broken.
    session.run("python", "-c", "import json, subprocess; entries = json.loads(subprocess.run(['agenttune', "
                "'plugins', 'list', '--json'], capture_output=True, text=True, check=True).stdout); "
                "[entry] = [e for e in entries if e['name'] == 'noxdemo']; "
                "assert entry['error'] is None and entry['backbones'] == ['noxdemo'], entry")
    with session.chdir(plugin):
        # Against the installed package: no src/ on the path (the template's pytest setting is for source trees).
        session.run("pytest", "-q", "-p", "no:cacheprovider", "-o", "pythonpath=")
        session.run("agenttune", "train", "--conf", "debug.yaml", "--backbone", "debug", "--run-dir",
                    str(work / "debug-run"))


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff on everything; mypy on the core and every plugin's src ([tool.mypy] in pyproject.toml);
    import-linter's contracts ([tool.importlinter]: the layers of docs/architecture.md, no cycles,
    no plugin imported by the core, plugins only through agenttune.plugin_api)."""
    # mypy reads the core's typed dependencies (torch, transformers, pydantic, ...) from this
    # environment; the plugins' own libraries (verl, trinity, agent frameworks) conflict with each
    # other and are listed as untyped in pyproject.toml instead. `guided`: engines/grammar.py imports xgrammar;
    # `tinker`: entrypoints/tinker/ reads the SDK's types.
    install_core(session, "local", "guided", "tinker")
    session.install(MYPY, "types-PyYAML", IMPORT_LINTER)
    session.run("ruff", "check", "src", "tests", "plugins", "examples", "bench", "noxfile.py")
    session.run("mypy")
    session.run("lint-imports", env={"PYTHONPATH": os.pathsep.join(PLUGIN_SOURCES)})


@nox.session(python=PYTHON)
def verl(session: nox.Session) -> None:
    """The verl backbone plugin, against verl 0.9.1's real agent-loop modules and Hydra configs (CPU)."""
    # torch is named in every install so that nothing resolves it to a CUDA wheel; verl 0.9.1
    # requires transformers <5.11 and its verl-core extra brings what the agent-loop modules import.
    session.install(CPU_TORCH)
    session.install(CPU_TORCH, "verl[verl-core]==0.9.1", "transformers>=5.5.3,<5.11")
    # The README's GPU install line without [gpu] (AgentScope 2.x and the math judge: its math agent's
    # `config show`, tests/test_readme_commands.py); 2.0.10: 2.0.11 pins a certifi newer than PyPI serves.
    session.install(CPU_TORCH, "-e", ".[dev]", "-e", "plugins/verl", "-e", "plugins/agentscope[agentscope2]",
                    "agentscope==2.0.10", "-e", "plugins/judges/gsm8k")
    session.run("pytest", "plugins/verl/tests", *session.posargs)


def _agentscope_session(session: nox.Session, line: str, agentscope: str) -> None:
    install_core(session, "local")  # the tests run a tiny transformers tokenizer; the example trains locally
    # The math judge runs in the math_agent example's test; the EnvService plugin in the seeds' env loop test.
    session.install(CPU_TORCH, "-e", f"plugins/agentscope[{line}]", agentscope,
                    "-e", "plugins/judges/gsm8k", "-e", "plugins/envservice")
    session.run("pytest", "plugins/agentscope/tests", *session.posargs)


@nox.session(python=PYTHON)
def agentscope1(session: nox.Session) -> None:
    """The AgentScope plugin on the latest AgentScope 1.0.x (ReActAgent, the seeds' line)."""
    _agentscope_session(session, "agentscope1", "agentscope>=1.0,<1.1")


@nox.session(python=PYTHON)
def agentscope2(session: nox.Session) -> None:
    """The AgentScope plugin on AgentScope 2.0.10 (2.0.11 pins a certifi newer than PyPI serves)."""
    _agentscope_session(session, "agentscope2", "agentscope==2.0.10")


@nox.session(python=PYTHON)
def trinity(session: nox.Session) -> None:
    """The Trinity-RFT backbone plugin, against trinity-rft 0.6.0's real config, buffer and workflow code and its
    Tinker mode against `agenttune tinker serve` (CPU)."""
    # The README's CPU install line (plugins/trinity/README.md): trinity-rft's own requirements resolve
    # verl and vLLM's CUDA stack, neither usable on a CPU machine. So: trinity-rft, verl 0.9.0 (its pin:
    # its advantage functions import verl's DataProto) and vLLM 0.23.0 (its explorer modules import
    # vLLM's config and chat-template names) with --no-deps, plus what those modules import (the plugin's
    # `cpu` extra). The unit tests put a stub `vllm` first on the path (any use raises); the CPU run
    # (test_cpu_run.py) imports the real one, as a user's run does.
    # pylatexenc: what Trinity's DAPO reward function imports, which the overlong-shaping test compares to.
    # agenttune's `tinker` extra: `agenttune tinker serve`, which Trinity's Tinker mode is tested against
    # (test_tinker_mode.py; the plugin's `cpu` extra pins the same SDK for Trinity's own Tinker modules).
    session.install(CPU_TORCH)
    session.install("--no-deps", "trinity-rft==0.6.0", "verl==0.9.0", "vllm==0.23.0")
    session.install(CPU_TORCH, "-e", ".[dev,local,tinker]", "-e", "plugins/trinity[cpu]", "pylatexenc")
    session.run("pytest", "plugins/trinity/tests", *session.posargs)


VLLM = "vllm==0.33.0"
# What the vLLM modules the `vllm` engine uses import (vllm, sampling_params, outputs, logprobs,
# engine.arg_utils, v1.engine.async_llm, distributed.weight_transfer), at vLLM 0.33.0's own pins
# where it has them; the rest of its requirements (CUDA kernels, flashinfer, torch 2.14) are not
# installed: nothing here runs on a GPU.
VLLM_CPU_IMPORTS = (
    "transformers>=5.16.1,<5.21", "msgspec", "cbor2", "pyzmq>=25.0.0", "aiohttp>=3.14.4", "requests>=2.33.0",
    "oss-harmony>=0.0.11", "cloudpickle", "pybase64", "cachetools", "py-cpuinfo", "prometheus_client>=0.18.0",
    "fastapi>=0.133.0,<0.137.0", "partial-json-parser", "llguidance>=1.7.0,<1.8.0", "uvloop",
    "xgrammar==0.2.8",  # vllm.parser imports it (AsyncLLM's input processor); no longer in agenttune[local]
)


@nox.session(python=PYTHON, default=False)
def vllm(session: nox.Session) -> None:
    """The `vllm` engine's calls against vLLM 0.33.0's real classes and signatures, on CPU (no GPU, no CUDA).

    Not a default session: vLLM's wheel alone is 340 MB (the environment about 3.8 GB with CPU torch).
    """
    install_core(session, "local")
    session.install("--no-deps", VLLM)  # its requirements pull CUDA torch 2.14 and GPU kernels
    session.install(CPU_TORCH, *VLLM_CPU_IMPORTS)
    session.run("pytest", "tests/components/engines/test_vllm_api.py", "tests/components/engines/test_local_vllm_engine.py", *session.posargs)


@nox.session(python=PYTHON)
def gsm8k(session: nox.Session) -> None:
    """The math judges (agenttune-plugin-gsm8k): real math-verify, `datasets` loading, a loopback judge server."""
    session.install("-e", ".[dev]", "-e", "plugins/judges/gsm8k")  # no torch: judging needs none
    session.run("pytest", "plugins/judges/gsm8k/tests", *session.posargs)


@nox.session(python=PYTHON)
def envservice(session: nox.Session) -> None:
    """The EnvService plugin against its test server as a real process; the AppWorld example's smoke run."""
    install_core(session, "local")  # the rollout tests tokenize with the tiny local model
    # AgentScope 1.x for examples/appworld (the seeds' ReActAgent), through the agentscope plugin.
    session.install(CPU_TORCH, "-e", "plugins/envservice", "-e", "plugins/agentscope[agentscope1]")
    session.run("pytest", "plugins/envservice/tests", *session.posargs)


@nox.session(python=PYTHON)
def openenv(session: nox.Session) -> None:
    """The OpenEnv plugin on openenv 0.10.0: test environments served by real uvicorn processes, faults, the example."""
    install_core(session, "local")  # the training test and the example run the tiny model
    # openenv pulls gradio and fastmcp (its web UI and MCP tools); their own session keeps them out of `tests`.
    session.install(CPU_TORCH, "-e", "plugins/openenv")
    session.run("pytest", "plugins/openenv/tests", *session.posargs)


@nox.session(python=PYTHON)
def verifiers(session: nox.Session) -> None:
    """The verifiers plugin on verifiers 0.4.0 (pinned by the plugin): environments written in the tests
    (single-turn, MCP tool, custom multi-turn) under the debug and local backbones; the example's debug run."""
    install_core(session, "local")  # the local-backbone tests train the tiny model
    # verifiers 0.4.0 needs openai>=2.54, mcp==2.0.0 and pydantic>=2.12.3: its own virtualenv (aworld's mcp~=1.10 conflicts).
    session.install(CPU_TORCH, "-e", "plugins/verifiers[v04]")
    session.run("pytest", "plugins/verifiers/tests", *session.posargs)


@nox.session(python=PYTHON)
def reasoning_gym(session: nox.Session) -> None:
    """The reasoning-gym plugin with the real reasoning-gym 0.1.25: reader, judge, its limits, the example's runs."""
    install_core(session, "local")  # the example's debug and local runs use the tiny model
    session.install(CPU_TORCH, "-e", "plugins/reasoning_gym")  # pins reasoning-gym==0.1.25
    session.run("pytest", "plugins/reasoning_gym/tests", *session.posargs)


@nox.session(python=PYTHON)
def verifiers03(session: nox.Session) -> None:
    """The verifiers plugin on verifiers 0.3.1 (`load_environment(**kw)` environments: single-turn, tool, custom
    multi-turn; Rubric scoring, environment_error, verifiers' own eval agreeing, a local-backbone run)."""
    install_core(session, "local")  # the local-backbone test trains the tiny model
    # verifiers 0.3.1 needs mcp<2, 0.4.0 pins mcp==2.0.0: its own virtualenv (the plugin's [v03] extra pins both).
    session.install(CPU_TORCH, "-e", "plugins/verifiers[v03]")
    session.run("pytest", "plugins/verifiers/tests", *session.posargs)  # conftest collects the test_legacy_* files


@nox.session(python=PYTHON)
def aworld(session: nox.Session) -> None:
    """The AWorld plugin on aworld 0.3.2: real agents, real MCP servers (stdio, HTTP), the GAIA-style example."""
    install_core(session, "local")  # the example trains the tiny model with the local backbone
    # aworld 0.3.2 pins mcp~=1.10.1, opentelemetry~=1.32 and json_repair~=0.49 (so it cannot share an
    # environment with AgentScope 2.x), and `import mcp` 1.10 fails under pydantic 2.14.
    session.install(CPU_TORCH, "-e", "plugins/aworld", "aworld==0.3.2", "mcp~=1.10.1", "pydantic<2.14")
    session.run("pytest", "plugins/aworld/tests", *session.posargs)
