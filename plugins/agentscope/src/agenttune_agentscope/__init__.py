"""agenttune's AgentScope plugin: the model under training as an AgentScope chat model."""
