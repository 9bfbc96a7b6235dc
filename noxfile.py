"""Test sessions. Each plugin gets its own virtualenv: their dependencies conflict (see README).

    nox                 every session (what CI runs)
    nox -s tests        the core
    nox -s verl -R      one plugin, reusing its virtualenv (fast iteration)

On a CPU-only machine torch is installed first from its CPU wheel (`torch==2.13.0`) so that no
session pulls CUDA packages.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True

PYTHON = "3.11"
CPU_TORCH = "torch==2.13.0"


def install_core(session: nox.Session, *extras: str) -> None:
    session.install(CPU_TORCH)
    spec = f".[{','.join(('dev', *extras))}]"
    session.install("-e", spec)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The core: plugin system, config, CLI, gateway, rollouts, the debug and local backbones."""
    install_core(session, "local")
    session.run("pytest", "tests", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "src", "tests", "plugins", "examples", "bench", "noxfile.py")
