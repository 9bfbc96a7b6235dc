"""Advantage estimators: the contract (`base.py`) and the built-ins (`outcome.py`, `turns.py`, `rejection.py`)."""
