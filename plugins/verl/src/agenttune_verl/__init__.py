"""agenttune's verl backbone: train any agenttune workflow on a GPU cluster through verl 0.9.1."""
