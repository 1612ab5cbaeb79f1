"""Real servers on loopback that stand in for the outside world in tests.

``LLMDouble`` speaks OpenRouter's OpenAI-compatible API, ``RPCDouble`` speaks
the Base JSON-RPC that web3 uses for a USDC balance, ``TelegramDouble`` the
Telegram Bot API (getUpdates, sendMessage). All are stdlib-only and run in a
daemon thread of the test process, so a ``brainstem`` subprocess can be pointed
at them through ``OPENROUTER_BASE_URL`` / ``BASE_RPC_URL`` /
``BRAINSTEM_TELEGRAM_API_URL``.
"""

from .llm_server import LLMDouble
from .rpc_server import RPCDouble
from .telegram_server import TelegramDouble

__all__ = ["LLMDouble", "RPCDouble", "TelegramDouble"]
