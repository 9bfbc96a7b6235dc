"""agenttune's Trinity-RFT backbone: train any agenttune workflow on a GPU cluster through Trinity-RFT."""
