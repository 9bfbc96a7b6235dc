"""The `agenttune-chat` verifiers harness: verifiers' own chat loop (the `null` harness's program), run by this Python.

verifiers' `null` and `bash` harnesses run their program in a uv-synced environment, which needs uv and
the network at the first rollout. Its dependencies (openai, mcp, httpx, ...) are verifiers' own, so
on this machine's subprocess runtime the running interpreter already has them: the same program, no
install. In any other runtime (a container) it is the `null` harness unchanged.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from verifiers.v1.harnesses.null.harness import NullHarness, NullHarnessConfig

__all__ = ["AgenttuneChatHarness"]


class AgenttuneChatHarness(NullHarness):
    async def setup(self, runtime: Any) -> None:
        if runtime.type != "subprocess":
            await super().setup(runtime)

    async def launch(self, ctx: Any, trace: Any, runtime: Any, *args: Any, **kwargs: Any) -> Any:
        if runtime.type == "subprocess":
            runtime = _ThisPython(runtime)
        return await super().launch(ctx, trace, runtime, *args, **kwargs)


class _ThisPython:
    """The subprocess runtime, with PEP 723 scripts run by `sys.executable` instead of a uv environment."""

    def __init__(self, runtime: Any):
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: dict[str, str] | None = None, *,
                                activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f".agenttune-chat-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]


# The config type verifiers resolves through the harness's generic base (NullHarness[NullHarnessConfig]).
AgenttuneChatHarnessConfig = NullHarnessConfig
