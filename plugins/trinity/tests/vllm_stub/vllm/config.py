class ModelConfig:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("vLLM is stubbed in agenttune's CPU tests: ModelConfig is not available")
