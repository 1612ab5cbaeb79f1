"""A Base JSON-RPC endpoint on loopback that answers what web3 asks for a USDC balance.

Stdlib only, runs in a daemon thread of the test process (``BASE_RPC_URL`` can
point a subprocess at ``.url``)::

    with RPCDouble() as rpc:
        rpc.balances["0xabc..."] = 12_345_678      # raw units: 12.345678 USDC
        ...
        assert "eth_call" in rpc.calls

Answers ``eth_chainId`` (0x2105 = 8453), ``net_version``, ``eth_blockNumber``
and ``eth_call`` of ``balanceOf(address)`` (selector 0x70a08231) on the USDC
contract; single and batch requests. ``.fail_with = 500`` makes every POST
answer that HTTP status; ``.delay`` sleeps before answering; ``.reply_body``
(bytes/str) is sent verbatim instead of a real answer (garbage tests).
``.calls`` lists method names, ``.eth_calls`` the ``eth_call`` params.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from .loopback import LoopbackDouble, QuietServer, send

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
BALANCE_OF = "0x70a08231"



class _Handler(BaseHTTPRequestHandler):
    server: QuietServer
    server_version = "RPCDouble/1.0"

    def log_message(self, format, *args):  # noqa: A002
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        send(self, status, body, {"Content-Type": ctype})

    def do_GET(self) -> None:  # noqa: N802
        self._send(405, b'{"error": "POST JSON-RPC here"}')

    def do_POST(self) -> None:  # noqa: N802
        d = self.server.double
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            req = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            req = None
        items = req if isinstance(req, list) else [req]
        with d._lock:
            for it in items:
                if isinstance(it, dict):
                    d.calls.append(str(it.get("method")))
                    if it.get("method") == "eth_call":
                        d.eth_calls.append(it.get("params"))
        if d.delay and d._stopping.wait(d.delay):
            return
        if d.fail_with:
            self._send(int(d.fail_with), b"double: scripted failure", "text/plain")
            return
        if d.reply_body is not None:
            body = d.reply_body.encode("utf-8") if isinstance(d.reply_body, str) else d.reply_body
            self._send(200, body)
            return
        if req is None:
            self._send(200, json.dumps({"jsonrpc": "2.0", "id": None,
                                        "error": {"code": -32700, "message": "parse error"}}).encode())
            return
        if isinstance(req, list):
            out: Any = [d._answer(it) for it in req]
        else:
            out = d._answer(req)
        self._send(200, json.dumps(out).encode("utf-8"))


class RPCDouble(LoopbackDouble):
    """A scripted Base JSON-RPC server on 127.0.0.1 (see the module docstring)."""

    handler = _Handler

    def __init__(self, balances: dict[str, int] | None = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.balances: dict[str, int] = dict(balances or {})
        self.chain_id = 8453
        self.block_number = 0x1234567
        self.fail_with: int | None = None
        self.delay: float = 0.0
        self.reply_body: bytes | str | None = None
        self.calls: list[str] = []
        self.eth_calls: list[Any] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    # ------------------------------------------------------------------ answers

    def _balance(self, address: str) -> int:
        address = address.lower()
        with self._lock:
            for k, v in self.balances.items():
                if k.lower() == address:
                    return int(v)
        return 0

    def _answer(self, item: Any) -> dict:
        if not isinstance(item, dict):
            return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "invalid request"}}
        rid = item.get("id")
        method = item.get("method")
        params = item.get("params") or []

        def ok(result: Any) -> dict:
            return {"jsonrpc": "2.0", "id": rid, "result": result}

        def err(code: int, message: str) -> dict:
            return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}

        if method == "eth_chainId":
            return ok(hex(self.chain_id))
        if method == "net_version":
            return ok(str(self.chain_id))
        if method == "eth_blockNumber":
            return ok(hex(self.block_number))
        if method == "eth_call":
            call = params[0] if isinstance(params, list) and params and isinstance(params[0], dict) else {}
            to = str(call.get("to") or "")
            data = str(call.get("data") or call.get("input") or "")
            if to.lower() != USDC_BASE.lower():
                return ok("0x")  # no code at that address: an empty answer, as a real node gives
            if not data.lower().startswith(BALANCE_OF) or len(data) != 2 + 8 + 64:
                return err(3, "execution reverted")
            address = "0x" + data[-40:].lower()
            return ok("0x" + format(self._balance(address), "064x"))
        return err(-32601, f"the method {method} does not exist/is not available")
