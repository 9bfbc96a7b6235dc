"""verifiers 0.1-0.3 environments: `load_environment(**kw)` returning a SingleTurnEnv / ToolEnv / MultiTurnEnv.

    loading.py   the environment, built once per process from its id and arguments
    tasks.py     its dataset rows (train) or eval rows (other splits) as agenttune Tasks
    rollout.py   its own `rollout` with its client pointed at the episode's gateway URL
    scoring.py   its Rubric on the episode's state, in agenttune's judge
"""
