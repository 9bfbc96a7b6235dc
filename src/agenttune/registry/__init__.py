"""The plugin system, and what it resolves a config into.

    hookspecs.py       the plugin hooks (register_*, config_sections, run_services, register_commands)
    manager.py         the plugin manager: entry points, isolation, get_component
    compatibility.py   the plugin API's table and version, old module paths -> where they live now
    config_loading.py  YAML + overrides + environment -> AgentTuneConfig with the plugins' sections
    resolution.py      a config's components resolved up front (preflight), build_engine

Plugins register through the entry-point group `agenttune`; agenttune's own components are the
`builtins` entry point (agenttune/entrypoints/builtins.py), found through the same door.
"""
