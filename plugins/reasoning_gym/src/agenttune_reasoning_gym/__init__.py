"""agenttune plugin for reasoning-gym: the `reasoning_gym` task reader and judge.

    generators.py  a generator (or a weighted mix) by name and config -> reasoning-gym datasets; clear errors
    reader.py      the `reasoning_gym` task reader: seeded, sized or endless, disjoint splits
    judge.py       the `reasoning_gym` judge: the generator's own score_answer on the <answer> tag
    plugin.py      the entry point's hooks
"""
