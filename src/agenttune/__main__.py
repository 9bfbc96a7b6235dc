"""`python -m agenttune` runs the command line."""

from agenttune.cli.main import main

main()
