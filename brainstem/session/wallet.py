"""USDC balance on Base: the wallet ground truth's hard-coded fallback.

web3 is imported inside :func:`usdc_balance` only: it costs about 0.8 s and
60 MB to import, and the sleep path of ``brainstem wake`` must not pay that. It
is an extra (``brainstem[wallet]``), not a dependency: an operator with no
wallet never installs the Ethereum stack, and one with a wallet but no web3 gets
an unknown balance and :data:`NEEDS_WEB3`, the one line that says what to install.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings

__all__ = ["NEEDS_WEB3", "USDC_BASE", "USDC_DECIMALS", "usdc_balance", "web3_missing"]

NEEDS_WEB3 = "web3 is not installed, so the wallet balance is unknown: pip install 'brainstem[wallet]'"

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
USDC_DECIMALS = 6

_ERC20_BALANCE_ABI = [
    {
        "constant": True,
        "inputs": [{"name": "account", "type": "address"}],
        "name": "balanceOf",
        "outputs": [{"name": "", "type": "uint256"}],
        "payable": False,
        "stateMutability": "view",
        "type": "function",
    }
]


def usdc_balance(rpc_url: str, address: str, *, timeout: float = 10.0, why: list[str] | None = None) -> float | None:
    """The USDC balance of ``address`` on Base in whole USDC, or None when it cannot be read.

    Never raises: an invalid address, an unreachable or failing RPC and a
    garbage answer all give None, and ``why`` (a list) is told the reason.
    One HTTP attempt per JSON-RPC call, each bounded by ``timeout`` (web3's own
    retry-with-backoff is switched off).
    """
    def unknown(reason: str) -> float | None:  # the answer when the balance cannot be read: None
        if why is not None:
            why.append(reason[:300])
        return None

    if not isinstance(rpc_url, str) or not rpc_url.strip():
        return unknown("no RPC URL")
    if not isinstance(address, str) or not address.strip():
        return unknown("no wallet address")
    try:
        with warnings.catch_warnings():  # web3 pulls in deprecated websockets.legacy
            warnings.simplefilter("ignore", DeprecationWarning)
            limit = sys.getrecursionlimit()
            try:
                from web3 import Web3  # noqa: PLC0415 -- heavy, optional: only a wallet balance needs it
            except ImportError:
                return unknown(NEEDS_WEB3)
            finally:
                # py_ecc, which web3 imports, raises the interpreter's recursion limit to 100,000 for its
                # own algorithms (never called here). Left that high, a deeply nested JSON answer (from an
                # RPC node, an LLM provider, the Bot API) overflows the C stack and kills the process
                # instead of raising RecursionError.
                sys.setrecursionlimit(limit)

        try:
            checksum = Web3.to_checksum_address(address.strip())
        except (ValueError, TypeError):
            return unknown(f"{address!r} is not a valid address")
        provider = Web3.HTTPProvider(
            rpc_url.strip(),
            request_kwargs={"timeout": timeout},
            exception_retry_configuration=None,
        )
        # no middleware: the default validation layer asks eth_chainId twice per
        # call, tripling the round trips (and the worst-case wait) for nothing
        w3 = Web3(provider, middleware=[])
        token = w3.eth.contract(address=Web3.to_checksum_address(USDC_BASE), abi=_ERC20_BALANCE_ABI)
        raw = token.functions.balanceOf(checksum).call()
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            return unknown(f"balanceOf answered {raw!r}")
        value = raw / 10**USDC_DECIMALS
        return value if math.isfinite(value) else unknown("balance is not finite")
    except Exception as exc:  # noqa: BLE001 - a balance checker never breaks a wake
        return unknown(f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")


def web3_missing() -> bool:
    """Whether web3 cannot be imported here, found without importing it (status asks, on every call)."""
    if "web3" in sys.modules:
        return sys.modules["web3"] is None  # None: an import of it is refused
    try:
        return importlib.util.find_spec("web3") is None
    except (ImportError, ValueError):
        return True
