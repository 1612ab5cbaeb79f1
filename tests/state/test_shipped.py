"""Behaviour of the seed tools (tools_seed/) and sanity of the seed prompts/config.

A tool's own logic (input checks, parsing answers, errors) is tested with its
source executed in-process and a ``ctx`` double that hands it real secret
values, in two ways:

* ``plain``: ``exec`` of the source into a dict, as the brief's minimal harness;
* ``restricted``: ``compile_restricted`` with only RestrictedPython's stock
  ``safe_builtins`` + ``limited_builtins`` (plus ``dict``, which the runtime's
  sandbox offers), its standard guards, and an import hook that hands out
  small prepared namespaces (never real modules). This is the strictest
  sandbox the runtime is likely to offer, so a tool that passes here should
  pass there.

``ctx.fetch`` really does HTTP (httpx) against a loopback ThreadingHTTPServer.

Where a secret may go is not the tool's decision but the runtime's: the tools
hold placeholders, and ``ctx.fetch`` puts a value in only for a host the
operator bound it to. Those tests run the file under test through
``brainstem.tools.services.run_tool`` (the real sandbox, ``ToolServices``, bindings as
in ``BRAINSTEM_TOOL_SECRETS``), with a second API double on 127.0.0.2 that
would accept the real token, so a token that reached it would show.
"""

from __future__ import annotations

import ast
import base64 as std_base64
import datetime as std_datetime
import hashlib as std_hashlib
import ipaddress
import json
import math as std_math
import random as std_random
import re
import socket
import threading
import time as std_time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from jsonschema import Draft202012Validator
from RestrictedPython import compile_restricted, limited_builtins, safe_builtins
from RestrictedPython.Eval import default_guarded_getitem, default_guarded_getiter
from RestrictedPython.Guards import (
    full_write_guard,
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
    safer_getattr,
)

from brainstem.core import keys
from brainstem.core.secrets import parse_bindings
from brainstem.sandbox import egress
from brainstem.state.guarded import AgentKV
from brainstem.store.sqlite.store import SQLiteStore
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import run_tool as run_in_runtime
from tests.helpers import REPO

ROOT = REPO
TOOLS_DIR = ROOT / "tools_seed"
PROMPTS_DIR = ROOT / "prompts_seed"
CONFIG_DIR = PROMPTS_DIR / "config"

SEED_TOOLS = {
    "web_fetch",
    "kv_read",
    "kv_write",
    "send_telegram",
    "check_or_balance",
    "check_wallet_balance",
    "topup_openrouter",
}
ALLOWED_IMPORTS = {"json", "re", "math", "datetime", "random", "hashlib", "base64", "time"}

USDC = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
WALLET = "0xAbCdEf0123456789aBcDeF0123456789AbCdEf01"
EMPTY_WALLET = "0x" + "11" * 20
RAW_BALANCES = {WALLET.lower(): 123_456_789, EMPTY_WALLET: 0}  # 6 decimals
OR_KEY = "sk-or-test-secret-0123"


# --------------------------------------------------------------------------
# loopback HTTP server
# --------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output quiet
        pass

    def reply(self, status, body, content_type="application/json"):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def record(self, body=None):
        self.server.requests.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )

    def do_GET(self):
        self.record()
        path = self.path
        if path == "/page":
            return self.reply(200, "<html>" + "x" * 20000 + "</html>", "text/html; charset=utf-8")
        if path == "/small":
            return self.reply(200, "hello", "text/plain")
        if path == "/missing":
            return self.reply(404, "nope", "text/plain")
        m = re.fullmatch(r"/or/(\w+)/(key|credits)", path)
        if m:
            return self.openrouter(m.group(1), m.group(2))
        return self.reply(404, {"error": "no route"})

    def openrouter(self, scenario, endpoint):
        if self.headers.get("Authorization") != "Bearer " + OR_KEY:
            return self.reply(401, {"error": {"message": "bad key"}})
        key_answers = {
            "limited": (200, {"data": {"limit": 20, "limit_remaining": 12.5, "usage": 7.5}}),
            "unlimited": (200, {"data": {"limit": None, "limit_remaining": None, "usage": 3}}),
            "keyfail": (500, {"error": "boom"}),
            "denied": (401, {"error": "denied"}),
            "html": (200, "<html>login</html>"),
        }
        credit_answers = {
            "unlimited": (200, {"data": {"total_credits": 20, "total_usage": 7.25}}),
            "keyfail": (200, {"data": {"total_credits": 10, "total_usage": 1}}),
            "denied": (403, {"error": "management key required"}),
            "html": (200, "<html>login</html>"),
        }
        answers = key_answers if endpoint == "key" else credit_answers
        status, body = answers.get(scenario, (404, {"error": "no scenario"}))
        return self.reply(status, body, "text/html" if isinstance(body, str) else "application/json")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        self.record(body)
        path = self.path
        if path in ("/", "/rpc"):
            return self.rpc(body)
        if path == "/rpc-500":
            return self.reply(500, "internal error", "text/plain")
        if path == "/rpc-html":
            return self.reply(200, "<html>not json</html>", "text/html")
        if path == "/rpc-error":
            return self.reply(200, {"jsonrpc": "2.0", "id": 1,
                                    "error": {"code": -32000, "message": "header not found"}})
        return self.reply(404, {"error": "no route"})

    def rpc(self, body):
        def error(message):
            return self.reply(200, {"jsonrpc": "2.0", "id": body.get("id"),
                                    "error": {"code": -32602, "message": message}})

        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or body.get("method") != "eth_call":
            return error("expected a JSON-RPC 2.0 eth_call")
        params = body.get("params") or []
        if len(params) != 2 or params[1] != "latest":
            return error("expected [call, 'latest']")
        call = params[0]
        if str(call.get("to", "")).lower() != USDC.lower():
            return error("wrong contract")
        data = call.get("data", "")
        if not (data.startswith("0x70a08231") and len(data) == 10 + 64 and data[10:34] == "0" * 24):
            return error("bad calldata")
        holder = "0x" + data[34:]
        if holder not in RAW_BALANCES:  # also catches upper-case hex: data must be lower-cased
            return error("unknown holder " + holder)
        return self.reply(200, {"jsonrpc": "2.0", "id": body.get("id"),
                                "result": "0x" + format(RAW_BALANCES[holder], "064x")})


def serve(address):
    srv = ThreadingHTTPServer((address, 0), Handler)
    srv.daemon_threads = True
    srv.requests = []
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    srv.base = f"http://{address}:{srv.server_address[1]}"
    return srv


@pytest.fixture(scope="module")
def server():
    srv = serve("127.0.0.1")
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def other_server():
    """The same API double on 127.0.0.2: any host a secret is not bound to. It accepts the real
    token, so a request that reached it with the token would succeed."""
    srv = serve("127.0.0.2")
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def http_client():
    with httpx.Client(timeout=5) as client:
        yield client


@pytest.fixture
def closed_port_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------
# ctx double
# --------------------------------------------------------------------------


class KVDouble:
    """Dict-backed ctx.kv with the contract's scoping (own / read_all)."""

    def __init__(self, store, tool, access):
        self.store, self.access, self.prefix = store, access, f"tooldata:{tool}:"

    def read_key(self, key):
        full = key if self.access == "read_all" else self.prefix + key
        if full.startswith("secret:"):
            raise PermissionError("secret:* keys are not readable by tools")
        return full

    def get(self, key):
        return self.store.get(self.read_key(key))

    def list(self, prefix=""):
        full = self.read_key(prefix)
        return sorted(k for k in self.store if k.startswith(full) and not k.startswith("secret:"))

    def put(self, key, value):
        if not isinstance(value, str):
            raise TypeError("kv values are text")
        self.store[self.prefix + key] = value

    def delete(self, key):
        self.store.pop(self.prefix + key, None)


class Ctx:
    def __init__(self, client=None, secrets=None, kv=None):
        self.client = client
        self.secrets = types.MappingProxyType(dict(secrets or {}))
        self.kv = kv
        self.logs = []
        self.fetches = []

    def fetch(self, url, method="GET", headers=None, json=None, data=None, timeout=None):
        self.fetches.append(url)
        if self.client is None:
            raise RuntimeError("this tool should not fetch")
        kwargs = {"headers": headers, "json": json, "timeout": timeout or 5}
        if isinstance(data, dict):
            kwargs["data"] = data
        elif data is not None:
            kwargs["content"] = data
        try:
            r = self.client.request(method, url, **kwargs)
        except httpx.HTTPError as err:  # like the runtime: a message naming the URL
            raise ConnectionError(f"fetch {url} failed: {type(err).__name__}") from None
        try:
            body = r.json()
        except ValueError:
            body = None
        return {"status": r.status_code, "headers": dict(r.headers), "text": r.text, "json": body}

    def log(self, msg):
        self.logs.append(str(msg))


# --------------------------------------------------------------------------
# harness: plain exec and RestrictedPython exec
# --------------------------------------------------------------------------


def ns(**functions):
    return types.SimpleNamespace(**functions)


PREPARED_MODULES = {
    "json": ns(loads=json.loads, dumps=json.dumps),
    "re": ns(match=re.match, search=re.search, findall=re.findall, sub=re.sub, fullmatch=re.fullmatch,
             split=re.split, escape=re.escape, IGNORECASE=re.IGNORECASE),
    "math": ns(floor=std_math.floor, ceil=std_math.ceil, sqrt=std_math.sqrt, log=std_math.log,
               isfinite=std_math.isfinite),
    "datetime": ns(datetime=std_datetime.datetime, timedelta=std_datetime.timedelta, timezone=std_datetime.timezone),
    "random": ns(random=std_random.random, randint=std_random.randint, choice=std_random.choice),
    "hashlib": ns(sha256=std_hashlib.sha256, md5=std_hashlib.md5),
    "base64": ns(b64encode=std_base64.b64encode, b64decode=std_base64.b64decode),
    "time": ns(time=std_time.time, sleep=std_time.sleep),
}


def restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
    if name not in PREPARED_MODULES or level != 0:
        raise ImportError(f"import of {name!r} is not allowed in tools")
    return PREPARED_MODULES[name]


def load_plain(source, filename):
    env = {"__name__": "seed_tool"}
    exec(compile(source, filename, "exec"), env)
    return env["execute"]


def load_restricted(source, filename):
    builtins = dict(safe_builtins)
    builtins.update(limited_builtins)
    builtins["dict"] = dict  # the runtime's sandbox has it (for isinstance)
    builtins["__import__"] = restricted_import
    env = {
        "__builtins__": builtins,
        "__name__": "seed_tool",
        "__metadata__": {},
        "_getattr_": safer_getattr,
        "_getitem_": default_guarded_getitem,
        "_getiter_": default_guarded_getiter,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_write_": full_write_guard,
    }
    exec(compile_restricted(source, filename, "exec"), env)
    return env["execute"]


@pytest.fixture(params=["plain", "restricted"])
def run_tool(request):
    loader = load_plain if request.param == "plain" else load_restricted

    def run(name, args, ctx):
        path = TOOLS_DIR / (name + ".py")
        execute = loader(path.read_text(), str(path))
        result = execute(args, ctx)
        json.dumps(result)  # must be JSON-serialisable
        return result

    return run


# --------------------------------------------------------------------------
# the real runtime: where a secret may go
# --------------------------------------------------------------------------

# Names a test makes up or borrows, as a resolver standing in for DNS answers them:
# each at the address of `other_server`. Any other name resolves to nothing.
OTHER_NAMES = {"openrouter.ai", "openrouter.ai.evil.example"}


def fake_resolve(host, port, timeout=10.0):
    host = host.lower()
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    if host == "localhost":
        return ["127.0.0.1"]
    if host in OTHER_NAMES:
        return ["127.0.0.2"]
    return []


class Runtime:
    """The file under test stored in a real store and run by ``brainstem.tools.services.run_tool``: the real
    sandbox and ``ToolServices``, the operator's bindings (``BRAINSTEM_TOOL_SECRETS`` entries) and
    fetch allow list. Secret values come from the environment; karma entries land in ``events``."""

    def __init__(self, store):
        self.store = store
        self.events = []

    def record(self, event, **fields):
        self.events.append(dict(fields, event=event))

    def __call__(self, name, args, bindings, *, llm_base_url="https://openrouter.ai/api/v1", public=None):
        self.events.clear()
        self.store.put(keys.tool_code(name), (TOOLS_DIR / (name + ".py")).read_text())
        self.store.put(keys.tool_meta(name), (TOOLS_DIR / (name + ".json")).read_text())
        policy = ToolPolicy(bindings=parse_bindings(bindings, llm_base_url), fetch_allow=["127.0.0.0/8"],
                            public=public or {})
        out = run_in_runtime(name, args, store=self.store, agent_kv=AgentKV(self.store, self.record),
                             record=self.record, policy=policy)
        assert out.ok, out.error  # the tool ran; what it answered is out.value
        json.dumps(out.value)
        return out.value

    def of(self, event):
        return [e for e in self.events if e["event"] == event]


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setattr(egress, "_default_resolver", fake_resolve)
    store = SQLiteStore(tmp_path / "store.db")
    yield Runtime(store)
    store.close()


def reached(srv, value):
    """The requests ``srv`` received that carry ``value`` anywhere."""
    return [r for r in srv.requests if value in json.dumps(r)]


# --------------------------------------------------------------------------
# web_fetch
# --------------------------------------------------------------------------


def test_web_fetch_truncates_to_default(run_tool, server, http_client):
    r = run_tool("web_fetch", {"url": server.base + "/page"}, Ctx(http_client))
    assert r["status"] == 200
    assert r["content_type"].startswith("text/html")
    assert r["truncated"] is True
    assert len(r["body"]) == 10000 and r["body"].startswith("<html>xxx")


def test_web_fetch_max_chars_and_small_body(run_tool, server, http_client):
    r = run_tool("web_fetch", {"url": server.base + "/page", "max_chars": 50}, Ctx(http_client))
    assert len(r["body"]) == 50 and r["truncated"] is True
    r = run_tool("web_fetch", {"url": server.base + "/small"}, Ctx(http_client))
    assert r == {"status": 200, "content_type": "text/plain", "body": "hello", "truncated": False}


def test_web_fetch_returns_non_200_status(run_tool, server, http_client):
    r = run_tool("web_fetch", {"url": server.base + "/missing"}, Ctx(http_client))
    assert r["status"] == 404 and r["body"] == "nope" and r["truncated"] is False


@pytest.mark.parametrize("args", [{}, {"url": ""}, {"url": "ftp://example.org/x"}, {"url": "file:///etc/passwd"},
                                  {"url": "http://x", "max_chars": "lots"}])
def test_web_fetch_rejects_bad_input(run_tool, args):
    ctx = Ctx()
    with pytest.raises(ValueError):
        run_tool("web_fetch", args, ctx)
    assert ctx.fetches == []


# --------------------------------------------------------------------------
# kv_read / kv_write
# --------------------------------------------------------------------------


@pytest.fixture
def store():
    return {
        "wisdom": "Be frugal.",
        "config:defaults": json.dumps({"wake": {"sleep_seconds": 60}}),
        "tooldata:kv_write:todo": json.dumps(["a", "b"]),
        "secret:TELEGRAM_CHAT_ID": "42",
    }


def test_kv_read_single_key_text_and_json(run_tool, store):
    ctx = Ctx(kv=KVDouble(store, "kv_read", "read_all"))
    r = run_tool("kv_read", {"key": "wisdom"}, ctx)
    assert r == {"ok": True, "key": "wisdom", "found": True, "value": "Be frugal."}
    r = run_tool("kv_read", {"key": "config:defaults"}, ctx)
    assert r["value"] == {"wake": {"sleep_seconds": 60}}
    r = run_tool("kv_read", {"key": "nothing:here"}, ctx)
    assert r == {"ok": True, "key": "nothing:here", "found": False, "value": None}


def test_kv_read_many_keys(run_tool, store):
    ctx = Ctx(kv=KVDouble(store, "kv_read", "read_all"))
    r = run_tool("kv_read", {"keys": ["wisdom", "tooldata:kv_write:todo", "gone"]}, ctx)
    assert r["ok"] is True
    assert r["values"] == {"wisdom": "Be frugal.", "tooldata:kv_write:todo": ["a", "b"], "gone": None}
    assert r["missing"] == ["gone"]


@pytest.mark.parametrize("args", [{}, {"key": ""}, {"key": 5}, {"key": "secret:TELEGRAM_CHAT_ID"},
                                  {"keys": "wisdom"}, {"keys": []}, {"keys": ["wisdom", "secret:X"]},
                                  {"keys": [f"k{i}" for i in range(51)]}])
def test_kv_read_rejects_bad_input_and_secrets(run_tool, store, args):
    ctx = Ctx(kv=KVDouble(store, "kv_read", "read_all"))
    with pytest.raises(ValueError):
        run_tool("kv_read", args, ctx)


def test_kv_write_lands_in_own_namespace(run_tool, store):
    ctx = Ctx(kv=KVDouble(store, "kv_write", "own"))
    r = run_tool("kv_write", {"key": "notes", "value": "remember this"}, ctx)
    assert r == {"ok": True, "key": "notes", "stored_as": "tooldata:kv_write:notes"}
    assert store["tooldata:kv_write:notes"] == "remember this"
    run_tool("kv_write", {"key": "plan", "value": {"n": 1, "items": [1, 2]}}, ctx)
    assert json.loads(store["tooldata:kv_write:plan"]) == {"n": 1, "items": [1, 2]}
    assert store["wisdom"] == "Be frugal."  # nothing outside its prefix changed


def test_kv_write_then_kv_read_round_trip(run_tool, store):
    run_tool("kv_write", {"key": "count", "value": 3}, Ctx(kv=KVDouble(store, "kv_write", "own")))
    r = run_tool("kv_read", {"key": "tooldata:kv_write:count"}, Ctx(kv=KVDouble(store, "kv_read", "read_all")))
    assert r["found"] is True and r["value"] == 3


@pytest.mark.parametrize("args", [{"value": "x"}, {"key": "", "value": "x"}, {"key": "k"},
                                  {"key": "k" * 201, "value": "x"}])
def test_kv_write_rejects_bad_input(run_tool, store, args):
    before = dict(store)
    with pytest.raises(ValueError):
        run_tool("kv_write", args, Ctx(kv=KVDouble(store, "kv_write", "own")))
    assert store == before


def test_kv_write_refuses_oversized_value(run_tool, store):
    r = run_tool("kv_write", {"key": "big", "value": "x" * 100001}, Ctx(kv=KVDouble(store, "kv_write", "own")))
    assert r["ok"] is False and "limit" in r["error"]
    assert "tooldata:kv_write:big" not in store


# --------------------------------------------------------------------------
# send_telegram
# --------------------------------------------------------------------------


class ChatCtx(Ctx):
    """A ctx whose ``send_telegram`` is the runtime's: the text goes to the operator's chat, or the runtime's
    one-line reason comes back as the tool's RuntimeError."""

    def __init__(self, fail=None):
        super().__init__()
        self.sent = []
        self.fail = fail

    def send_telegram(self, text):
        if self.fail:
            raise RuntimeError(self.fail)
        self.sent.append(text)
        return {"message_id": 4242}


def test_send_telegram_asks_the_runtime_to_send(run_tool):
    ctx = ChatCtx()
    assert run_tool("send_telegram", {"text": "hello operator"}, ctx) == {"ok": True, "message_id": 4242}
    assert ctx.sent == ["hello operator"] and ctx.fetches == []
    run_tool("send_telegram", {"text": "x" * 5000}, ctx)
    assert ctx.sent[-1] == "x" * 4095 + "…"  # Telegram's limit is 4096 characters


@pytest.mark.parametrize("args", [{"text": "  "}, {"text": 5}, {},
                                  {"text": "hi", "chat_id": 777}, {"text": "hi", "api_base": "http://127.0.0.1"}])
def test_send_telegram_takes_a_text_for_the_operators_chat_only(run_tool, args):
    ctx = ChatCtx()
    with pytest.raises(ValueError):
        run_tool("send_telegram", args, ctx)
    assert ctx.sent == []


def test_send_telegram_fails_with_the_runtimes_reason(run_tool):
    why = "telegram: not configured: set BRAINSTEM_TELEGRAM_BOT_TOKEN and BRAINSTEM_TELEGRAM_CHAT_ID"
    with pytest.raises(RuntimeError, match="BRAINSTEM_TELEGRAM_CHAT_ID"):
        run_tool("send_telegram", {"text": "hi"}, ChatCtx(fail=why))


def elsewhere_url(where, server, other_server, path):
    bound, other = server.server_address[1], other_server.server_address[1]
    return {
        "another_host": f"http://127.0.0.2:{other}",
        "another_name_for_the_bound_host": f"http://localhost:{bound}",
        "user_info_disguise": f"http://127.0.0.1:{bound}@127.0.0.2:{other}",
        "look_alike_name": f"http://openrouter.ai.evil.example:{other}",
    }[where] + path


ELSEWHERE = ["another_host", "another_name_for_the_bound_host", "user_info_disguise", "look_alike_name"]


# --------------------------------------------------------------------------
# check_or_balance
# --------------------------------------------------------------------------


def or_run(run_tool, server, client, scenario, key=OR_KEY):
    ctx = Ctx(client, secrets={"OPENROUTER_API_KEY": key} if key else {})
    return run_tool("check_or_balance", {"base_url": server.base + "/or/" + scenario + "/"}, ctx), ctx


def test_or_balance_from_key_limit(run_tool, server, http_client):
    r, ctx = or_run(run_tool, server, http_client, "limited")
    assert r == {"ok": True, "balance": 12.5, "source": "key"}
    assert ctx.fetches == [server.base + "/or/limited/key"]
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer " + OR_KEY


def test_or_balance_falls_back_to_credits_when_unlimited(run_tool, server, http_client):
    r, ctx = or_run(run_tool, server, http_client, "unlimited")
    assert r == {"ok": True, "balance": 12.75, "source": "credits"}
    assert ctx.fetches == [server.base + "/or/unlimited/key", server.base + "/or/unlimited/credits"]


def test_or_balance_falls_back_to_credits_when_key_errors(run_tool, server, http_client):
    r, _ = or_run(run_tool, server, http_client, "keyfail")
    assert r == {"ok": True, "balance": 9.0, "source": "credits"}


def test_or_balance_both_denied(run_tool, server, http_client):
    r, _ = or_run(run_tool, server, http_client, "denied")
    assert r == {"ok": False, "error": "could not read the OpenRouter balance (/key: HTTP 401; /credits: HTTP 403)"}


def test_or_balance_non_json(run_tool, server, http_client):
    r, _ = or_run(run_tool, server, http_client, "html")
    assert r["ok"] is False and "JSON" in r["error"]


def test_or_balance_missing_secret(run_tool, server, http_client):
    r, ctx = or_run(run_tool, server, http_client, "limited", key=None)
    assert r["ok"] is False and "OPENROUTER_API_KEY" in r["error"]
    assert ctx.fetches == []


@pytest.mark.parametrize("base_url", ["ftp://openrouter.ai/api/v1", "openrouter.ai/api/v1", "file:///etc/passwd"])
def test_or_balance_wants_an_http_base_url(run_tool, http_client, base_url):
    ctx = Ctx(http_client, secrets={"OPENROUTER_API_KEY": OR_KEY})
    r = run_tool("check_or_balance", {"base_url": base_url}, ctx)
    assert r == {"ok": False, "error": "base_url must be an http:// or https:// URL"}
    assert ctx.fetches == []


def test_or_balance_uses_the_configured_base_url_unless_given_one(run_tool, server, http_client):
    configured = server.base + "/or/limited"
    ctx = Ctx(http_client, secrets={"OPENROUTER_API_KEY": OR_KEY, "OPENROUTER_BASE_URL": configured})
    assert run_tool("check_or_balance", {}, ctx) == {"ok": True, "balance": 12.5, "source": "key"}
    assert ctx.fetches == [configured + "/key"]
    ctx = Ctx(http_client, secrets={"OPENROUTER_API_KEY": OR_KEY, "OPENROUTER_BASE_URL": configured})
    r = run_tool("check_or_balance", {"base_url": server.base + "/or/unlimited"}, ctx)
    assert r == {"ok": True, "balance": 12.75, "source": "credits"}
    assert ctx.fetches == [server.base + "/or/unlimited/key", server.base + "/or/unlimited/credits"]


def test_or_balance_reports_failed_requests(run_tool, http_client, closed_port_url):
    ctx = Ctx(http_client, secrets={"OPENROUTER_API_KEY": OR_KEY})
    r = run_tool("check_or_balance", {"base_url": closed_port_url}, ctx)
    assert r["ok"] is False and "/key: fetch " in r["error"] and "/credits: fetch " in r["error"]
    assert ctx.fetches == [closed_port_url + "/key", closed_port_url + "/credits"]


@pytest.mark.parametrize("where", ELSEWHERE)
def test_or_balance_key_goes_only_to_the_bound_host(runtime, server, other_server, monkeypatch, where):
    monkeypatch.setenv("OPENROUTER_API_KEY", OR_KEY)
    configured = server.base + "/or/limited"

    def run(args):  # a bare OPENROUTER_API_KEY is bound to the host of OPENROUTER_BASE_URL
        return runtime("check_or_balance", args, ["OPENROUTER_API_KEY"], llm_base_url=configured,
                       public={"OPENROUTER_BASE_URL": configured})

    assert run({}) == {"ok": True, "balance": 12.5, "source": "key"}
    assert server.requests[-1]["path"] == "/or/limited/key"
    assert server.requests[-1]["headers"]["Authorization"] == "Bearer " + OR_KEY
    sent = len(server.requests), len(other_server.requests)

    r = run({"base_url": elsewhere_url(where, server, other_server, "/or/limited")})
    assert r["ok"] is False and "/key: refused" in r["error"] and "/credits: refused" in r["error"]
    assert "OPENROUTER_API_KEY" in r["error"] and "not bound to" in r["error"]
    assert (len(server.requests), len(other_server.requests)) == sent  # refused before anything was sent
    assert reached(other_server, OR_KEY) == [] and OR_KEY not in json.dumps(r)
    assert [e["secrets"] for e in runtime.of("secret_refused")] == [["OPENROUTER_API_KEY"]] * 2


def test_a_secret_never_goes_over_plain_http_to_a_remote_host(runtime, other_server, monkeypatch):
    # The bound name resolves (here) to the second double, reached over plain http: refused.
    monkeypatch.setenv("OPENROUTER_API_KEY", OR_KEY)
    sent = len(other_server.requests)
    r = runtime("check_or_balance", {"base_url": f"http://openrouter.ai:{other_server.server_address[1]}/or/limited"},
                ["OPENROUTER_API_KEY@openrouter.ai"])
    assert r["ok"] is False and "refused" in r["error"] and "plain http" in r["error"]
    assert len(other_server.requests) == sent
    assert reached(other_server, OR_KEY) == []


def test_or_balance_unreachable_through_the_runtime(runtime, closed_port_url, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", OR_KEY)
    r = runtime("check_or_balance", {"base_url": closed_port_url}, ["OPENROUTER_API_KEY@127.0.0.1"])
    assert r["ok"] is False and "/key: " in r["error"] and "/credits: " in r["error"]
    assert "could not connect" in r["error"] and "not bound" not in r["error"] and OR_KEY not in json.dumps(r)
    assert [f["secrets"] for f in runtime.of("fetch")] == [["OPENROUTER_API_KEY"]] * 2  # tried, with the key


# --------------------------------------------------------------------------
# check_wallet_balance
# --------------------------------------------------------------------------


def test_wallet_balance_explicit_address(run_tool, server, http_client):
    r = run_tool("check_wallet_balance", {"address": WALLET, "rpc_url": server.base + "/rpc"}, Ctx(http_client))
    assert r["ok"] is True
    assert r["balance_usdc"] == pytest.approx(123.456789)
    assert r["address"] == WALLET and r["raw"] == "123456789"
    call = server.requests[-1]["body"]["params"][0]
    assert call["to"].lower() == USDC.lower()
    assert call["data"] == "0x70a08231" + "0" * 24 + WALLET[2:].lower()


def test_wallet_balance_address_and_rpc_from_secrets(run_tool, server, http_client):
    ctx = Ctx(http_client, secrets={"WALLET_ADDRESS": EMPTY_WALLET, "BASE_RPC_URL": server.base + "/rpc"})
    r = run_tool("check_wallet_balance", {}, ctx)
    assert r == {"ok": True, "balance_usdc": 0.0, "raw": "0", "address": EMPTY_WALLET}


@pytest.mark.parametrize("address", ["0x1234", "AbCdEf0123456789aBcDeF0123456789AbCdEf0123",
                                     "0xZZCdEf0123456789aBcDeF0123456789AbCdEf01", "0x" + "a" * 41, 12345])
def test_wallet_balance_rejects_bad_address(run_tool, server, http_client, address):
    ctx = Ctx(http_client)
    r = run_tool("check_wallet_balance", {"address": address, "rpc_url": server.base + "/rpc"}, ctx)
    assert r["ok"] is False and "invalid address" in r["error"]
    assert ctx.fetches == []


def test_wallet_balance_missing_address(run_tool, http_client):
    r = run_tool("check_wallet_balance", {}, Ctx(http_client))
    assert r["ok"] is False and "WALLET_ADDRESS" in r["error"]


@pytest.mark.parametrize("path,needle", [("/rpc-500", "HTTP 500"), ("/rpc-html", "not JSON"),
                                         ("/rpc-error", "header not found")])
def test_wallet_balance_rpc_failures(run_tool, server, http_client, path, needle):
    r = run_tool("check_wallet_balance", {"address": WALLET, "rpc_url": server.base + path}, Ctx(http_client))
    assert r["ok"] is False and needle in r["error"]


def test_wallet_balance_unreachable_rpc(run_tool, http_client, closed_port_url):
    r = run_tool("check_wallet_balance", {"address": WALLET, "rpc_url": closed_port_url}, Ctx(http_client))
    assert r["ok"] is False and "RPC request failed" in r["error"]


def test_wallet_balance_rpc_url_holding_a_key_never_reaches_the_tool(runtime, server):
    # A BASE_RPC_URL without a path is a setting the tool gets ...
    r = runtime("check_wallet_balance", {}, [], public={"WALLET_ADDRESS": WALLET, "BASE_RPC_URL": server.base})
    assert r["ok"] is True and r["raw"] == "123456789" and server.requests[-1]["path"] == "/"
    # ... one with a path, where a provider's key hides, is withheld: the tool uses the public
    # endpoint, which nothing here resolves.
    keyed = server.base + "/rpc/v2/PROVIDER-API-KEY-123"
    r = runtime("check_wallet_balance", {}, [], public={"WALLET_ADDRESS": WALLET, "BASE_RPC_URL": keyed})
    assert r["ok"] is False and r["error"].startswith("RPC request failed") and "mainnet.base.org" in r["error"]
    assert "PROVIDER-API-KEY-123" not in json.dumps(r) and reached(server, "PROVIDER-API-KEY-123") == []
    assert [n["secret_name"] for n in runtime.of("secret_not_granted")] == ["BASE_RPC_URL"]


# --------------------------------------------------------------------------
# topup_openrouter
# --------------------------------------------------------------------------


def test_topup_is_honestly_not_implemented(run_tool):
    ctx = Ctx()  # fetch would raise: the tool must not try anything
    r = run_tool("topup_openrouter", {"amount_usd": 10}, ctx)
    assert r == {
        "ok": False,
        "error": "not implemented: topping up OpenRouter from the wallet needs an on-chain payment flow "
        "that Brainstem does not ship; ask the operator",
    }
    assert ctx.fetches == []


# --------------------------------------------------------------------------
# static checks: metas, RestrictedPython, config, prompts
# --------------------------------------------------------------------------

META_FIELDS = {"description", "input", "secrets", "kv_secrets", "kv_access", "timeout_ms", "mode"}


def load_json(path):
    return json.loads(Path(path).read_text())


def test_seed_tools_are_the_expected_set():
    assert {p.stem for p in TOOLS_DIR.glob("*.py")} == SEED_TOOLS
    assert {p.stem for p in TOOLS_DIR.glob("*.json")} == SEED_TOOLS


@pytest.mark.parametrize("name", sorted(SEED_TOOLS))
def test_tool_meta_has_required_fields(name):
    meta = load_json(TOOLS_DIR / (name + ".json"))
    assert META_FIELDS <= set(meta), META_FIELDS - set(meta)
    assert isinstance(meta["description"], str) and meta["description"].strip()
    # input is a JSON Schema of an object, each argument described: what an agent step offers the model
    Draft202012Validator.check_schema(meta["input"])
    assert meta["input"]["type"] == "object"
    props = meta["input"]["properties"]
    assert isinstance(props, dict) and props
    assert all(isinstance(p.get("description"), str) and p["description"] for p in props.values())
    assert set(meta["input"].get("required", [])) <= set(props)
    assert isinstance(meta["secrets"], list) and all(isinstance(s, str) for s in meta["secrets"])
    assert isinstance(meta["kv_secrets"], list) and all(isinstance(s, str) for s in meta["kv_secrets"])
    assert meta["kv_access"] in {"none", "own", "read_all"}
    assert isinstance(meta["timeout_ms"], int) and 0 < meta["timeout_ms"] <= 60000
    assert meta["mode"] == "automated"


def test_tool_meta_grants_what_the_code_uses():
    assert load_json(TOOLS_DIR / "kv_read.json")["kv_access"] == "read_all"
    assert load_json(TOOLS_DIR / "kv_write.json")["kv_access"] == "own"
    for name in SEED_TOOLS:
        src = (TOOLS_DIR / (name + ".py")).read_text()
        meta = load_json(TOOLS_DIR / (name + ".json"))
        granted = set(meta["secrets"]) | set(meta["kv_secrets"])
        used = set(re.findall(r'ctx\.secrets\.get\("([A-Z0-9_]+)"\)', src))
        assert used <= granted, (name, used - granted)
        if "ctx.kv." in src:
            assert meta["kv_access"] != "none", name


@pytest.mark.parametrize("name", sorted(SEED_TOOLS))
def test_tool_compiles_under_restricted_python(name):
    path = TOOLS_DIR / (name + ".py")
    src = path.read_text()
    compile_restricted(src, str(path), "exec")  # raises SyntaxError on disallowed constructs
    tree = ast.parse(src)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "execute" in funcs and [a.arg for a in funcs["execute"].args.args] == ["args", "ctx"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= ALLOWED_IMPORTS, name
        assert not isinstance(node, ast.ImportFrom), name


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.json")), ids=lambda p: p.name)
def test_config_json_parses(path):
    assert isinstance(load_json(path), dict)


def test_config_files_present():
    names = {p.name for p in CONFIG_DIR.glob("*.json")}
    assert {"defaults.json", "models.json", "resources.json", "tool_registry.json"} <= names


def test_defaults_layout():
    d = load_json(CONFIG_DIR / "defaults.json")
    assert d["orient"] == {"model": "sonnet", "effort": "medium", "max_output_tokens": 4000}
    assert d["reflect"] == {"model": "haiku", "effort": "low", "max_output_tokens": 2000}
    assert d["deep_reflect"]["default_interval_sessions"] == 20 and d["deep_reflect"]["default_interval_days"] == 7
    assert d["session_budget"] == {"max_cost": 0.10, "max_steps": 12, "max_duration_seconds": 600}
    assert d["failure_handling"] == {"retries": 1, "on_fail": "skip_and_cascade"}
    assert d["wake"] == {"sleep_seconds": 21600, "default_effort": "low"}
    assert d["memory"]["default_load_keys"] == ["wisdom"]
    assert d["execution"]["max_subplan_depth"] == 3 and d["execution"]["fallback_model"] == "haiku"
    assert [t["field"] for t in d["tripwires"]] == ["balances.openrouter", "balances.wallet_usdc"]


def test_models_alias_map_covers_every_alias():
    m = load_json(CONFIG_DIR / "models.json")
    fields = {"id", "alias", "input_cost_per_mtok", "output_cost_per_mtok", "max_output_tokens", "supports_reasoning"}
    aliases = set()
    for model in m["models"]:
        assert fields <= set(model), model
        assert m["alias_map"][model["alias"]] == model["id"]
        assert model["input_cost_per_mtok"] > 0 and model["output_cost_per_mtok"] > 0
        aliases.add(model["alias"])
    assert set(m["alias_map"]) == aliases
    assert m["fallback_model"] in aliases
    defaults = load_json(CONFIG_DIR / "defaults.json")
    for section in ("orient", "reflect", "deep_reflect"):
        assert defaults[section]["model"] in aliases
    assert defaults["execution"]["fallback_model"] in aliases


def test_tool_registry_matches_tool_metas():
    registry = load_json(CONFIG_DIR / "tool_registry.json")["tools"]
    assert set(registry) == SEED_TOOLS
    for name, entry in registry.items():
        meta = load_json(TOOLS_DIR / (name + ".json"))
        assert entry["description"] == meta["description"]
        assert entry["input"] == meta["input"], name  # what orient is told is what the tool says


def first_json_object(text, marker):
    """The first JSON object that starts a line after ``marker``."""
    start = text.index(marker)
    m = re.compile(r"^\{", re.M).search(text, start)
    assert m, f"no JSON object after {marker!r}"
    obj, _ = json.JSONDecoder().raw_decode(text, m.start())
    return obj


def test_prompt_files_present_and_never_template_the_soul():
    for name in ("soul.example.md", "orient.md", "reflect.md", "deep.md", "subplan.md"):
        text = (PROMPTS_DIR / name).read_text()
        assert text.strip()
        if name != "soul.example.md":
            assert "{{soul}}" not in text


def test_orient_example_plan_is_valid():
    text = (PROMPTS_DIR / "orient.md").read_text()
    plan = first_json_object(text, "## Example")
    assert {"steps", "session_budget", "mid_session_tripwires", "next_wake_config"} <= set(plan)
    aliases = set(load_json(CONFIG_DIR / "models.json")["alias_map"])
    stored = set()

    def walk(steps):
        for step in steps:
            assert step["type"] in {"action", "think", "conditional", "subplan", "reflect", "agent"}
            if step["type"] == "agent":
                assert set(step["tools"]) <= SEED_TOOLS
            refs = set(re.findall(r"\{\{(\w+)\}\}", json.dumps(step.get("input", {})) + step.get("prompt", "")))
            assert refs <= stored, refs - stored
            if step["type"] == "action":
                assert step["tool"] in SEED_TOOLS
            if "model" in step:
                assert step["model"] in aliases
            for branch in step.get("branches", {}).values():
                walk(branch)
            if "store_result_as" in step:
                stored.add(step["store_result_as"])

    walk(plan["steps"])


def test_orient_and_subplan_prompts_document_every_step_type():
    from brainstem.core.plan import KNOWN_TYPES

    for name in ("orient.md", "subplan.md"):
        text = (PROMPTS_DIR / name).read_text()
        for step_type in KNOWN_TYPES:
            if name == "subplan.md" and step_type == "reflect":
                continue  # a subplan is told to leave it out
            assert f'"type": "{step_type}"' in text, (name, step_type)
    # the agent step: when to use it rather than an action
    orient = (PROMPTS_DIR / "orient.md").read_text()
    assert "max_turns" in orient and "depends on what a tool returns" in orient


def test_orient_uses_only_known_variables():
    known = {"models", "resources", "config", "tools"} | {"context." + k for k in (
        "balances", "kvUsage", "lastReflect", "additionalContext", "kvIndex", "effort",
        "deepReflectDue", "crashData", "sessionId", "now", "inbox", "schedules")}
    text = (PROMPTS_DIR / "orient.md").read_text()
    head = text[: text.index("## Answer format")]
    assert set(re.findall(r"\{\{([\w.]+)\}\}", head)) <= known


def test_reflect_and_deep_answer_shapes():
    reflect_text = (PROMPTS_DIR / "reflect.md").read_text()
    r = first_json_object(reflect_text, "## Answer format")
    assert {"session_summary", "note_to_future_self", "next_orient_context"} <= set(r)
    assert isinstance(r["next_orient_context"]["load_keys"], list)
    assert set(re.findall(r"\{\{([\w.]+)\}\}", reflect_text)) <= {
        "karma", "sessionCost", "results", "plan", "context.lastReflect", "context.balances", "context.schedules"}
    deep_text = (PROMPTS_DIR / "deep.md").read_text()
    d = first_json_object(deep_text, "Example shape")
    assert {"reflection", "note_to_future_self"} <= set(d)
    assert set(re.findall(r"\{\{([\w.]+)\}\}", deep_text)) <= {
        "wisdom", "recentKarma", "orientPrompt", "currentDefaults", "sessionHistory", "models",
        "context.balances", "context.kvUsage", "context.memoryStats", "context.notes", "context.toolRecords",
        "context.replayGate", "context.schedules"}
    for key in ("orient_prompt_proposals", "proposed_text", "updated_defaults", "next_deep_reflect",
                "updated_model_details", "kv_operations"):
        assert key in deep_text
