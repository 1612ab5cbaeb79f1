"""USDC balance on Base through real web3 against a JSON-RPC server on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from brainstem.session.wallet import NEEDS_WEB3, USDC_BASE, usdc_balance
from tests.doubles import RPCDouble
from tests.helpers import free_port as closed_port

WALLET = "0x1111111111111111111111111111111111111111"
OTHER = "0xdeadbeef00000000000000000000000000c0ffee"


@pytest.fixture
def rpc():
    with RPCDouble() as d:
        yield d


def test_balance_six_decimals(rpc):
    rpc.balances[WALLET] = 12_345_678
    assert usdc_balance(rpc.url, WALLET) == pytest.approx(12.345678)


def test_eth_call_data_sent(rpc):
    rpc.balances[OTHER] = 1
    assert usdc_balance(rpc.url, OTHER.upper().replace("0X", "0x")) == pytest.approx(0.000001)
    assert rpc.calls == ["eth_call"]  # one round trip: no chain-id chatter
    (call, block), = rpc.eth_calls
    assert call["to"].lower() == USDC_BASE.lower()
    data = call.get("data") or call.get("input")
    assert data == "0x70a08231" + "0" * 24 + OTHER[2:].lower()
    assert block == "latest"


def test_large_balance(rpc):
    rpc.balances[WALLET] = 10**12 + 1  # a million USDC and a micro-cent
    assert usdc_balance(rpc.url, WALLET) == pytest.approx(1_000_000.000001)


def test_unknown_address_is_zero(rpc):
    assert usdc_balance(rpc.url, OTHER) == 0.0


@pytest.mark.parametrize("bad", ["", "nope", "0x123", "0x" + "g" * 40, None, 42])
def test_invalid_address_is_none(rpc, bad):
    assert usdc_balance(rpc.url, bad) is None
    assert rpc.calls == []


def test_rpc_500_is_none(rpc):
    rpc.fail_with = 500
    rpc.balances[WALLET] = 5_000_000
    assert usdc_balance(rpc.url, WALLET) is None
    assert len(rpc.calls) == 1  # web3's own retry loop is off


@pytest.mark.parametrize("body", ["garbage", "[]", '{"jsonrpc": "2.0", "id": 0, "result": "0x"}',
                                  '{"jsonrpc": "2.0", "id": 0, "result": "0xnothex"}'])
def test_garbage_answer_is_none(rpc, body):
    rpc.reply_body = body
    assert usdc_balance(rpc.url, WALLET) is None


def test_unreachable_port_is_none():
    t0 = time.monotonic()
    assert usdc_balance(f"http://127.0.0.1:{closed_port()}/", WALLET, timeout=1.0) is None
    assert time.monotonic() - t0 < 1.5


def test_slow_rpc_is_none_within_timeout(rpc):
    rpc.delay = 2.0
    rpc.balances[WALLET] = 1
    t0 = time.monotonic()
    assert usdc_balance(rpc.url, WALLET, timeout=0.3) is None
    assert time.monotonic() - t0 < 1.0
    assert len(rpc.calls) == 1


def test_bad_rpc_url_is_none():
    assert usdc_balance("", WALLET) is None
    assert usdc_balance("not a url", WALLET) is None


def test_importing_wallet_does_not_import_web3():
    code = "import sys, brainstem.session.wallet; print('web3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.slow
def test_reading_the_wallet_leaves_the_recursion_limit_so_deep_json_is_an_error_not_a_crash(rpc):
    # web3's py_ecc raises the recursion limit to 100,000 on import; a process that had read its wallet
    # would then die (SIGSEGV, nothing recorded) on the first deeply nested JSON from any server.
    code = (
        "import json, sys\n"
        "from brainstem.session.wallet import usdc_balance\n"
        "before = sys.getrecursionlimit()\n"
        f"usdc_balance({rpc.url!r}, '0x1234567890AbcdEF1234567890aBcdef12345678')\n"
        "assert sys.getrecursionlimit() == before, sys.getrecursionlimit()\n"
        "try:\n"
        "    json.loads('[' * 200000 + ']' * 200000)\n"
        "except RecursionError:\n"
        "    print('RecursionError')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "RecursionError", (r.returncode, r.stderr[-500:])


NO_WEB3 = '''import sys


class NoWeb3:  # an install without the wallet extra: web3 cannot be found
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "web3":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoWeb3())
'''


def test_without_web3_installed_the_balance_is_unknown_and_says_to_install_the_wallet_extra(rpc, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_WEB3)
    code = ("import json; from brainstem.session.wallet import usdc_balance, web3_missing; why = []; "
            f"print(json.dumps([usdc_balance({rpc.url!r}, {WALLET!r}, why=why), why, web3_missing()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [None, [NEEDS_WEB3], True]
    assert NEEDS_WEB3.endswith("pip install 'brainstem[wallet]'") and rpc.calls == []  # nothing was asked
    here = subprocess.run([sys.executable, "-c", "from brainstem.session.wallet import web3_missing; "
                           "print(web3_missing())"], capture_output=True, text=True, timeout=30)
    assert here.stdout.strip() == "False", here.stderr  # installed (the test extras bring it)
