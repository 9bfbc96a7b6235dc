"""A stand-in for vLLM, for CPU tests only (vLLM needs CUDA and does not install here).

Trinity-RFT 0.6.0 imports vLLM at module level in `trinity.common.models.mm_utils`, which
`trinity.common.models.model` (ModelWrapper) and the explorer import. Only the names imported there
exist; using any of them raises, so a test that reaches real vLLM code fails loudly.
"""

__version__ = "0.0.0+agenttune.stub"
