"""Policy losses: the contract (`base.py`) and the built-ins (`policy_gradient.py`, `supervised.py`,
`distillation.py`)."""
