"""Services a run needs beside the backbone: environment servers, judge models, ...

Plugins hand them over through the `run_services(config, run)` hook as context managers;
`run_services` below enters them all before the backbone starts and exits them, in reverse order,
when the run ends — normally, on an error, or on Ctrl-C. A service that cannot start stops the run
before any rollout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from agenttune.config.models import AgentTuneConfig
from agenttune.config.run import Run
from agenttune.registry.manager import get_plugin_manager


@contextmanager
def run_services(config: AgentTuneConfig, run: Run) -> Iterator[None]:
    with ExitStack() as stack:
        for manager in get_plugin_manager().pm.hook.run_services(config=config, run=run):
            stack.enter_context(manager)
        yield
