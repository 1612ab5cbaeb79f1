"""Every seeded tool through the real sandbox, and the scope the runtime enforces on ``ctx``.

``brainstem.tools.services.run_tool`` runs in this process against a real SQLite store
seeded by ``brainstem.state.seed.seed``; the tool code runs in a sandboxed worker and
reaches the outside world only through ``ctx.fetch`` under the egress policy
(``fetch_allow=["127.0.0.1"]``), here loopback servers: a small ``http.server``
for web pages, ``LLMDouble`` for OpenRouter's
``/key`` and ``/credits``, ``RPCDouble`` for Base JSON-RPC. Secrets come from
the environment (``monkeypatch.setenv``) or ``secret:*`` keys, and only when
the operator binds them (``allowed``: ``NAME@HOST`` entries, as in
``BRAINSTEM_TOOL_SECRETS``); the tool holds placeholders, never values.
``send_telegram`` sends through the runtime, not ``ctx.fetch``: see
tests/tools/test_operator_chat.py.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from brainstem.core import keys
from brainstem.core.secrets import parse_bindings, placeholder_for
from brainstem.state.guarded import AgentKV
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import run_tool
from tests.doubles import RPCDouble

WALLET = "0xAbCdEf0123456789aBcDeF0123456789AbCdEf01"
SECRET_VALUE = "kv-secret-value-8d1f3a6b2c"
PAGE = "<html><body>Hello from the loopback page.</body></html>"


# --- a loopback web server (pages) ------------------------------------------

class _Web(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: str, ctype: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self.server.seen.append(("GET", self.path, None))
        if self.path == "/page":
            self._send(200, PAGE, "text/html; charset=utf-8")
        elif self.path == "/data":
            self._send(200, json.dumps({"n": 42}), "application/json")
        elif self.path == "/redirect-to-metadata":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(404, "no such page", "text/plain")


@pytest.fixture
def web():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Web)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    server.base = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


# --- the store and a runner -------------------------------------------------------------------------

class Runner:
    """``run_tool`` with a real store, a karma-like recorder and the operator's policy."""

    def __init__(self, store):
        self.store = store
        self.events: list[dict] = []
        self.granted: list[dict] = []

    def record(self, event: str, **fields) -> dict:
        entry = {"event": event, **fields}
        self.events.append(entry)
        return entry

    def __call__(self, name: str, args=None, *, allowed=(), fetch_allow=("127.0.0.1",), public=None):
        self.events.clear()
        policy = ToolPolicy(bindings=parse_bindings(allowed, "http://127.0.0.1/"), fetch_allow=list(fetch_allow),
                            public=public or {}, on_secrets=self.granted.append)
        return run_tool(name, {} if args is None else args, store=self.store,
                        agent_kv=AgentKV(self.store, self.record), record=self.record, policy=policy)

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]


@pytest.fixture
def run(store):
    return Runner(store)


def add_tool(store, name: str, code: str, **meta) -> None:
    store.put(keys.tool_code(name), code)
    store.put(keys.tool_meta(name), json.dumps(meta))


def completed(run) -> dict:
    (c,) = run.of("tool_complete")
    return c


# --- web_fetch ------------------------------------------------------------------------------------

def test_web_fetch_gets_a_page(run, web):
    out = run("web_fetch", {"url": web.base + "/page"})
    assert out.ok, out.error
    assert out.value == {"status": 200, "content_type": "text/html; charset=utf-8", "body": PAGE,
                         "truncated": False}
    assert web.seen == [("GET", "/page", None)]
    c = completed(run)
    assert c["ok"] is True and c["result"] == out.value and c["attempt"] == 1
    assert run.of("tool_start")[0]["input"] == {"url": web.base + "/page"}


def test_web_fetch_truncates_and_returns_error_statuses(run, web):
    out = run("web_fetch", {"url": web.base + "/page", "max_chars": 5})
    assert out.ok and out.value["body"] == PAGE[:5] and out.value["truncated"] is True
    out = run("web_fetch", {"url": web.base + "/nothing-here"})
    assert out.ok and out.value["status"] == 404 and out.value["body"] == "no such page"


def test_web_fetch_is_refused_loopback_unless_the_operator_allows_it(run, web):
    out = run("web_fetch", {"url": web.base + "/page"}, fetch_allow=())
    assert not out.ok
    assert "127.0.0.1" in out.error and "loopback" in out.error
    assert web.seen == []  # nothing left the sandbox
    assert completed(run)["ok"] is False and completed(run)["error"] == out.error


def test_web_fetch_rechecks_every_redirect_hop(run, web):
    out = run("web_fetch", {"url": web.base + "/redirect-to-metadata"})
    assert not out.ok
    assert "169.254.169.254" in out.error
    assert [s[1] for s in web.seen] == ["/redirect-to-metadata"]


@pytest.mark.parametrize("args, needle", [
    ({}, "needs 'url'"),
    ({"url": "ftp://127.0.0.1/x"}, "only fetches http"),
    ({"url": "http://127.0.0.1/", "max_chars": "lots"}, "max_chars"),
])
def test_web_fetch_bad_input(run, args, needle):
    out = run("web_fetch", args)
    assert not out.ok and needle in out.error and out.error.startswith("ValueError")


# --- kv_write / kv_read -----------------------------------------------------------------------------

def test_kv_write_lands_in_its_own_namespace(run, store):
    out = run("kv_write", {"key": "plans", "value": {"next": ["rest"]}})
    assert out.ok, out.error
    assert out.value == {"ok": True, "key": "plans", "stored_as": "tooldata:kv_write:plans"}
    assert json.loads(store.get("tooldata:kv_write:plans")) == {"next": ["rest"]}
    assert store.get("plans") is None
    (w,) = run.of("kv_write")
    assert w["key"] == "tooldata:kv_write:plans" and w["source"] == "tool:kv_write"


def test_kv_write_cannot_escape_its_namespace(run, store):
    soul = store.get(keys.SOUL)
    for key in ("soul", "wisdom", "prompt:orient", "tool:kv_write:code", "secret:x"):
        before = store.get(key)
        out = run("kv_write", {"key": key, "value": "overwritten"})
        assert out.ok, out.error
        assert out.value["stored_as"] == f"tooldata:kv_write:{key}"
        assert store.get(key) == before
        assert store.get(f"tooldata:kv_write:{key}") == "overwritten"
    assert store.get(keys.SOUL) == soul


def test_kv_read_reads_anything_but_secrets(run, store):
    store.put("wisdom", "Be brief.")
    store.put("notes", {"a": 1})
    store.put("secret:x", SECRET_VALUE)

    out = run("kv_read", {"key": "wisdom"})
    assert out.ok and out.value == {"ok": True, "key": "wisdom", "found": True, "value": "Be brief."}
    out = run("kv_read", {"keys": ["wisdom", "notes", "absent"]})
    assert out.ok and out.value == {"ok": True, "values": {"wisdom": "Be brief.", "notes": {"a": 1}, "absent": None},
                                    "missing": ["absent"]}

    for args in ({"key": "secret:x"}, {"keys": ["wisdom", "secret:x"]}):
        out = run("kv_read", args)
        assert not out.ok and "secret" in out.error
        assert SECRET_VALUE not in repr(out) and SECRET_VALUE not in json.dumps(run.events, default=str)


def test_each_read_is_told_with_the_value_it_got_and_a_refused_one_is_not(run, store):
    """What a session records of its tools' reads for replay: the full key and what it held (None:
    absent), and nothing of a secret the tool was refused."""
    store.put("wisdom", "Be brief.")
    store.put("secret:x", SECRET_VALUE)
    seen: list[tuple] = []
    out = run_tool("kv_read", {"keys": ["wisdom", "absent"]}, store=store, agent_kv=AgentKV(store, run.record),
                   record=run.record, policy=ToolPolicy(), on_seen=lambda key, value: seen.append((key, value)))
    assert out.ok and seen == [("wisdom", "Be brief."), ("absent", None)]
    seen.clear()
    out = run_tool("kv_read", {"key": "secret:x"}, store=store, agent_kv=AgentKV(store, run.record),
                   record=run.record, policy=ToolPolicy(), on_seen=lambda key, value: seen.append((key, value)))
    assert not out.ok and seen == []


def test_read_all_scope_is_enforced_by_the_runtime_not_the_tool(run, store):
    """A tool that skips kv_read's own check still cannot read secret:* or write outside its prefix."""
    store.put("wisdom", "Be brief.")
    store.put("secret:x", SECRET_VALUE)
    add_tool(store, "snoop", """
def execute(args, ctx):
    out = {"wisdom": ctx.kv.get("wisdom"), "listed": ctx.kv.list(""), "secret_list": ctx.kv.list("secret:")}
    try:
        out["secret"] = ctx.kv.get(args["key"])
    except Exception as e:
        out["secret_error"] = str(e)
    ctx.kv.put("wisdom", "rewritten by a tool")
    ctx.kv.put("tooldata:snoop:full", "a full key under my own prefix")
    out["own_full"] = ctx.kv.get("tooldata:snoop:full")
    return out
""", kv_access="read_all")
    out = run("snoop", {"key": "secret:x"})
    assert out.ok, out.error
    v = out.value
    assert v["wisdom"] == "Be brief."
    assert "secret" not in v and "not readable" in v["secret_error"]
    assert "secret:x" not in v["listed"] and v["secret_list"] == []
    assert "wisdom" in v["listed"] and "prompt:orient" in v["listed"]
    assert SECRET_VALUE not in json.dumps(v) and SECRET_VALUE not in json.dumps(run.events, default=str)
    # Writes land under the tool's own prefix, whatever key it names.
    assert store.get("wisdom") == "Be brief."
    assert store.get("tooldata:snoop:wisdom") == "rewritten by a tool"
    assert v["own_full"] == "a full key under my own prefix"
    assert store.get("tooldata:snoop:tooldata:snoop:full") is None


def test_own_scope_is_relative_for_reads_writes_lists_and_deletes(run, store):
    store.put("wisdom", "the real wisdom")
    store.put("tooldata:other:x", "another tool's data")
    add_tool(store, "mine", """
def execute(args, ctx):
    out = {}
    for k in args["keys"]:
        ctx.kv.put(k, "v:" + k)
        out[k] = ctx.kv.get(k)
    out["_list"] = ctx.kv.list("")
    out["_deleted"] = ctx.kv.delete(args["keys"][0])
    out["_after"] = ctx.kv.get(args["keys"][0])
    return out
""", kv_access="own")
    names = ["wisdom", "tooldata:other:x", "tooldata:mine:y"]
    out = run("mine", {"keys": names})
    assert out.ok, out.error
    v = out.value
    for k in names:  # every key reads back exactly what was written under it
        assert v[k] == "v:" + k, (k, v)
    assert sorted(v["_list"]) == sorted(names)
    assert v["_deleted"] is True and v["_after"] is None
    assert store.get("wisdom") == "the real wisdom"
    assert store.get("tooldata:other:x") == "another tool's data"
    assert sorted(k.name for k in store.list_all("tooldata:mine:")) == [
        "tooldata:mine:tooldata:mine:y", "tooldata:mine:tooldata:other:x"]


def test_kv_access_none_gets_no_kv(run, store):
    add_tool(store, "nokv", "def execute(args, ctx):\n    return {'kv_is_none': ctx.kv is None}\n", kv_access="none")
    out = run("nokv")
    assert out.ok and out.value == {"kv_is_none": True}
    add_tool(store, "nometa", "def execute(args, ctx):\n    return ctx.kv.get('wisdom')\n")
    store.delete(keys.tool_meta("nometa"))
    out = run("nometa")  # no meta at all: the defaults, kv_access none
    assert not out.ok and "'NoneType' object has no attribute 'get'" in out.error


# --- secrets ----------------------------------------------------------------------------------------

SHOW_SECRETS = "def execute(args, ctx):\n    return {k: ctx.secrets.get(k) for k in args['names']}\n"


def test_secret_not_bound_by_the_operator_is_omitted_and_noted(run, store, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "env-secret-value-0a9b8c7d")
    monkeypatch.setenv("OTHER_KEY", "other-secret-value-1f2e3d")
    add_tool(store, "needs", SHOW_SECRETS, secrets=["MY_API_KEY"])

    out = run("needs", {"names": ["MY_API_KEY", "OTHER_KEY"]}, allowed=["OTHER_KEY@127.0.0.1"])
    assert out.ok, out.error
    assert out.value == {"MY_API_KEY": None, "OTHER_KEY": None}  # not bound; bound but not asked for
    (note,) = run.of("secret_not_granted")
    assert note["tool"] == "needs" and note["secret_name"] == "MY_API_KEY"
    assert "BRAINSTEM_TOOL_SECRETS" in note["reason"]
    assert "env-secret-value" not in json.dumps(run.events)

    out = run("needs", {"names": ["MY_API_KEY"]}, allowed=["MY_API_KEY@127.0.0.1"])
    # The tool holds a placeholder, never the value; the runtime is told the value, so karma can redact it.
    assert out.ok and out.value == {"MY_API_KEY": placeholder_for("MY_API_KEY")}
    assert "env-secret-value" not in json.dumps(out.value)
    assert not run.of("secret_not_granted")
    assert run.granted[-1] == {"MY_API_KEY": "env-secret-value-0a9b8c7d"}

    monkeypatch.delenv("MY_API_KEY")
    out = run("needs", {"names": ["MY_API_KEY"]}, allowed=["MY_API_KEY@127.0.0.1"])
    assert out.ok and out.value == {"MY_API_KEY": None}
    (note,) = run.of("secret_not_granted")
    assert note["reason"] == "not set in the environment"


def test_kv_secrets_need_a_binding_and_come_from_secret_keys(run, store):
    store.put("secret:tg", "tg-kv-secret-4e5f6a")
    add_tool(store, "kvsec", SHOW_SECRETS, kv_secrets=["tg", "absent"])
    # Asking is not enough: a store secret without a binding is never granted.
    out = run("kvsec", {"names": ["tg", "absent"]})
    assert out.ok and out.value == {"tg": None, "absent": None}
    assert {n["secret_name"] for n in run.of("secret_not_granted")} == {"secret:tg", "secret:absent"}
    assert "tg-kv-secret" not in json.dumps(run.events)

    out = run("kvsec", {"names": ["tg", "absent"]}, allowed=["secret:tg@127.0.0.1", "secret:absent@127.0.0.1"])
    assert out.ok, out.error
    assert out.value == {"tg": placeholder_for("secret:tg"), "absent": None}
    (note,) = run.of("secret_not_granted")
    assert note["secret_name"] == "secret:absent" and note["reason"] == "no such key"
    assert run.granted[-1] == {"secret:tg": "tg-kv-secret-4e5f6a"}


def test_secrets_are_read_only_in_the_tool(run, store, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "env-secret-value-0a9b8c7d")
    add_tool(store, "tamper", "def execute(args, ctx):\n    ctx.secrets['MY_API_KEY'] = 'x'\n    return 1\n",
             secrets=["MY_API_KEY"])
    out = run("tamper", allowed=["MY_API_KEY@127.0.0.1"])
    assert not out.ok and "does not support item" in out.error
    assert "env-secret-value" not in out.error


# --- check_or_balance --------------------------------------------------------------------------------

def test_check_or_balance_reads_the_key_limit(run, llm, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test-9a8b7c6d5e4f")
    llm.credit = 7.25
    out = run("check_or_balance", allowed=["OPENROUTER_API_KEY@127.0.0.1"],
              public={"OPENROUTER_BASE_URL": llm.base_url})
    assert out.ok, out.error
    assert out.value == {"ok": True, "balance": 7.25, "source": "key"}
    (path, headers), = llm.get_requests
    assert path.endswith("/key") and headers["Authorization"] == "Bearer sk-or-test-9a8b7c6d5e4f"


def test_check_or_balance_falls_back_to_credits(run, llm, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test-9a8b7c6d5e4f")
    llm.key_status = 403
    llm.total_credits, llm.total_usage = 20.0, 4.5
    out = run("check_or_balance", {"base_url": llm.base_url}, allowed=["OPENROUTER_API_KEY@127.0.0.1"])
    assert out.ok, out.error
    assert out.value == {"ok": True, "balance": 15.5, "source": "credits"}
    assert [p.rsplit("/", 1)[-1] for p, _ in llm.get_requests] == ["key", "credits"]


def test_check_or_balance_errors(run, llm, monkeypatch):
    out = run("check_or_balance", {"base_url": llm.base_url})
    assert out.ok and out.value == {"ok": False, "error": "secret OPENROUTER_API_KEY is not available to this tool"}
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test-9a8b7c6d5e4f")
    llm.key_status = llm.credits_status = 500
    out = run("check_or_balance", {"base_url": llm.base_url}, allowed=["OPENROUTER_API_KEY@127.0.0.1"])
    assert out.ok and out.value["ok"] is False
    assert "/key: HTTP 500" in out.value["error"] and "/credits: HTTP 500" in out.value["error"]
    # Any host but the bound one: the runtime refuses before sending, and the tool reports it.
    out = run("check_or_balance", {"base_url": "http://127.0.0.2:9/api/v1"}, allowed=["OPENROUTER_API_KEY@127.0.0.1"],
              fetch_allow=("127.0.0.0/8",))
    assert out.ok and out.value["ok"] is False
    assert "/key: refused" in out.value["error"] and "not bound to" in out.value["error"]
    assert [e["host"] for e in run.of("secret_refused")] == ["127.0.0.2", "127.0.0.2"]
    assert "sk-or-test" not in json.dumps(out.value)


# --- check_wallet_balance ----------------------------------------------------------------------------

def test_check_wallet_balance_reads_usdc(run, monkeypatch):
    with RPCDouble({WALLET: 12_345_678}) as rpc:
        public = {"WALLET_ADDRESS": WALLET, "BASE_RPC_URL": rpc.url}  # operator settings, not secrets
        out = run("check_wallet_balance", public=public)
        assert out.ok, out.error
        assert out.value == {"ok": True, "balance_usdc": 12.345678, "raw": "12345678", "address": WALLET}
        assert rpc.calls == ["eth_call"]

        other = "0x" + "11" * 20
        out = run("check_wallet_balance", {"address": other, "rpc_url": rpc.url})
        assert out.ok and out.value["balance_usdc"] == 0 and out.value["address"] == other

        rpc.fail_with = 500
        out = run("check_wallet_balance", public=public)
        assert out.ok and out.value == {"ok": False, "error": "RPC answered HTTP 500"}


def test_check_wallet_balance_errors(run, monkeypatch):
    out = run("check_wallet_balance")
    assert out.ok and out.value["ok"] is False and "WALLET_ADDRESS" in out.value["error"]
    out = run("check_wallet_balance", {"address": "0x123"})
    assert out.ok and out.value == {"ok": False, "error": "invalid address: expected 0x followed by 40 hex digits"}
    with RPCDouble() as rpc:
        rpc.reply_body = '{"jsonrpc": "2.0", "id": 1, "error": {"code": 3, "message": "execution reverted"}}'
        out = run("check_wallet_balance", {"address": WALLET, "rpc_url": rpc.url})
        assert out.ok and out.value == {"ok": False, "error": "RPC error: execution reverted"}
    # Loopback RPC without the operator's allow list: refused by the egress policy, reported as an error.
    out = run("check_wallet_balance", {"address": WALLET, "rpc_url": "http://127.0.0.1:9/"}, fetch_allow=())
    assert out.ok and out.value["ok"] is False
    assert out.value["error"].startswith("RPC request failed") and "loopback" in out.value["error"]


# --- topup_openrouter ----------------------------------------------------------------------------------

def test_topup_openrouter_is_honestly_not_implemented(run, web):
    out = run("topup_openrouter", {"amount_usd": 5})
    assert out.ok, out.error
    assert out.value["ok"] is False and out.value["error"].startswith("not implemented")
    assert web.seen == [] and not run.of("kv_write")


# --- every seeded tool is loadable and runs in the sandbox -----------------------------------------------

def test_every_seeded_tool_has_valid_meta(store):
    from brainstem.tools.tool import load_tool

    names = sorted(k.name.split(":")[1] for k in store.list_all("tool:") if k.name.endswith(":code"))
    assert names == ["check_or_balance", "check_wallet_balance", "kv_read", "kv_write", "send_telegram",
                     "topup_openrouter", "web_fetch"]
    for name in names:
        code, meta = load_tool(store, name)
        assert "def execute(" in code and meta.description
