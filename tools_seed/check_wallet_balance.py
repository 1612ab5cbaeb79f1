# check_wallet_balance: USDC balance of a wallet on Base, read with a raw
# JSON-RPC eth_call of ERC-20 balanceOf(address) on the USDC contract.

DEFAULT_RPC_URL = "https://mainnet.base.org"
USDC_CONTRACT = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
BALANCE_OF_SELECTOR = "0x70a08231"
USDC_DECIMALS = 6
HEX_DIGITS = "0123456789abcdefABCDEF"


def is_hex(text):
    if len(text) == 0:
        return False
    for ch in text:
        if ch not in HEX_DIGITS:
            return False
    return True


def is_address(value):
    return isinstance(value, str) and len(value) == 42 and value.startswith("0x") and is_hex(value[2:])


def execute(args, ctx):
    address = args.get("address")
    if address is None or address == "":
        address = ctx.secrets.get("WALLET_ADDRESS")
    if address is None or address == "":
        return {"ok": False, "error": "no address given and secret WALLET_ADDRESS is not available"}
    if isinstance(address, str):
        address = address.strip()
    if not is_address(address):
        return {"ok": False, "error": "invalid address: expected 0x followed by 40 hex digits"}

    rpc_url = args.get("rpc_url") or ctx.secrets.get("BASE_RPC_URL") or DEFAULT_RPC_URL
    if not isinstance(rpc_url, str):
        raise ValueError("'rpc_url' must be a string")

    data = BALANCE_OF_SELECTOR + address[2:].lower().rjust(64, "0")
    payload = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "eth_call",
        "params": [{"to": USDC_CONTRACT, "data": data}, "latest"],
    }
    try:
        response = ctx.fetch(rpc_url, method="POST", json=payload, timeout=10)
    except Exception as err:
        return {"ok": False, "error": "RPC request failed: " + str(err)}

    status = response.get("status")
    if status != 200:
        return {"ok": False, "error": "RPC answered HTTP " + str(status)}
    body = response.get("json")
    if not isinstance(body, dict):
        return {"ok": False, "error": "RPC answer is not JSON"}
    if body.get("error") is not None:
        problem = body.get("error")
        if isinstance(problem, dict):
            problem = problem.get("message") or problem
        return {"ok": False, "error": "RPC error: " + str(problem)}

    result = body.get("result")
    if not isinstance(result, str) or not result.startswith("0x") or not is_hex(result[2:]):
        return {"ok": False, "error": "unexpected eth_call result: " + str(result)[:100]}
    raw = int(result, 16)
    return {
        "ok": True,
        "balance_usdc": raw / (10 ** USDC_DECIMALS),
        "raw": str(raw),
        "address": address,
    }
