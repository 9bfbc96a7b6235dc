"""Which AgentScope line is installed: 1.x (ReActAgent) and 2.x (Agent) have different model APIs."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from agenttune.plugin_api import UserError

SUPPORTED_LINES = (1, 2)


def agentscope_line() -> int:
    """The installed AgentScope major version, or a UserError saying how to install one."""
    try:
        installed = version("agentscope")
    except PackageNotFoundError:
        raise UserError(
            "The agent framework 'agentscope' needs the agentscope package, which is not installed.",
            hint="Install it with `pip install 'agentscope>=1.0,<1.1'` (ReActAgent) or "
            "`pip install agentscope==2.0.10` (Agent).",
        ) from None
    major = int(installed.split(".")[0])
    if major not in SUPPORTED_LINES:
        raise UserError(
            f"agentscope {installed} is installed, but agenttune-plugin-agentscope supports the 1.x "
            "and 2.x lines only.",
            hint="Install `agentscope>=1.0,<1.1` or `agentscope==2.0.10`.",
        )
    return major
