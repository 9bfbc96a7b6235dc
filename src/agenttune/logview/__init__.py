"""The log viewer: read every trajectory of a run token by token in the browser.

    agenttune logview [PATH] [--port 8181] [--host 127.0.0.1]
    agenttune train --conf ... --with-logview

Modules: `catalog` (which runs and step files a root holds; path checks), `step_index` (byte-offset
index of a rollout file: episode tables without parsing token arrays), `run_metrics` (charts from
metrics.jsonl), `app` (the Starlette app: JSON API + static page), `server` (binding, foreground and
background serving; `agenttune.entrypoints.train_with_logview` starts it beside training). The page itself is plain HTML, CSS
and JavaScript in `static/`, served by the package: no CDN, works offline. See docs/logview.md.
"""
