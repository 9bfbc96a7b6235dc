"""A module that fails while importing, as a user's half-written workflow file would."""

raise ImportError("cannot import name 'Agent' from 'somewhere' (a typo in the user's module)")
