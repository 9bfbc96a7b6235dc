"""`python -m agenttune` runs the command line."""

from agenttune.entrypoints.cli.main import main

main()
