"""Where the outside world comes in: the recipes that put the floors below together.

    cli/                  the `agenttune` command line (typer; imports nothing heavy)
    train.py              train_from_config: the one training code path (CLI and Python API)
    train_with_logview.py `agenttune train --with-logview`
    python_api.py         agenttune.Trainer: train from Python
    serve.py              `agenttune serve`: the gateway in front of a model, no training
    tinker/               `agenttune tinker serve`: the Tinker API (tinker SDK 0.38) on the local trainer
    services.py           services plugins start beside a run (run_services hook)
    builtins.py           agenttune's own components, registered through the `agenttune` entry point
                          like any plugin's
"""
