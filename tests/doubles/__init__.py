"""Real servers on loopback that stand in for the outside world in tests.

``LLMDouble`` speaks OpenRouter's OpenAI-compatible API, ``RPCDouble`` speaks
the Base JSON-RPC that web3 uses for a USDC balance. Both are stdlib-only and
run in a daemon thread of the test process, so a ``brainstem`` subprocess can
be pointed at them through ``OPENROUTER_BASE_URL`` / ``BASE_RPC_URL``.
"""

from .llm_server import LLMDouble
from .rpc_server import RPCDouble

__all__ = ["LLMDouble", "RPCDouble"]
