"""The provider cascade and the balance checkers, end to end.

``brainstem wake --force`` runs as a subprocess against a real store (Redis
and SQLite) and the LLM double. The agent's own code (``provider:llm:code``,
``provider:*_balance:code``) runs in the real sandbox; the tests read karma
and keys back to see which tier answered each call, what was snapshotted, and
that the secrets the adapter was given never reach karma or the store.

Tiers, as ``llm_call`` entries name them: ``dynamic`` (``provider:llm:code``),
``last_working`` (the runtime's snapshot of the last tier-1 code that worked),
``hardcoded`` (the built-in OpenRouter client).
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from brainstem.core import keys
from brainstem.state.seed import seed
from brainstem.state.shipped import seed_dirs
from tests.doubles import RPCDouble
from tests.helpers import run_cli
from tests.wake_helpers import (
    API_KEY,
    answers,
    events_of,
    finished,
    llm_calls,
    plan,
    reflection,
    run_wake,
    seeded,
    think,
    wake_env,
)

PROVIDER_SECRETS = "OPENROUTER_API_KEY"  # bare: bound to the LLM endpoint's host
LAST_CODE = keys.PROVIDER_LLM_LAST_WORKING_CODE
LAST_META = keys.PROVIDER_LLM_LAST_WORKING_META
WALLET = "0x1234567890AbcdEF1234567890aBcdef12345678"
RELAY_TOKEN = "relay-token-6b1d0c9e8f7a"

RAISING_ADAPTER = "def call(request, ctx):\n    raise RuntimeError('tier one is broken')\n"
BROKEN_ADAPTERS = {
    "syntax_error": ("def call(request, ctx):\n    return {'content': (\n", None, "SyntaxError"),
    "raises": (RAISING_ADAPTER, None, "RuntimeError: tier one is broken"),
    "not_a_dict": ("def call(request, ctx):\n    return ['not', 'a', 'dict']\n", None,
                   "must return {'content': str"),
    "loops": ("def call(request, ctx):\n    n = 0\n    while True:\n        n += 1\n",
              {"timeout_ms": 500}, "timed out after 500 ms"),
}


def on_stores(cases: dict | list, both: set) -> list:
    """Parameters for ``(real_store_url, case)``: every case on SQLite, those in ``both`` on Redis too.

    How an adapter or checker fails does not depend on the store; one case per test proves it on Redis.
    """
    names = list(cases)

    def marks(n):  # a looping case waits out a timeout
        return [pytest.mark.slow] if n == "loops" else []
    return ([pytest.param("sqlite", n, id=f"sqlite-{n}", marks=marks(n)) for n in names]
            + [pytest.param("redis", n, id=f"redis-{n}", marks=marks(n)) for n in names if n in both])


def seeded_adapter_code() -> str:
    return (seed_dirs()[1] / "providers" / "llm.py").read_text()


def seeded_adapter_meta() -> str:
    return (seed_dirs()[1] / "providers" / "llm.json").read_text()


def one_session(llm, env: dict, store, *, reflect: str | None = None, outcome: str | None = "clean"):
    """Script orient (a plan with one think step), the think and reflect; run one wake; return its karma."""
    llm.reset()
    llm.queue(plan(think("Say hello to the operator.", store_result_as="hello")))
    llm.responder = answers("hello", reflect=reflect)
    r = run_wake(env, "--force")
    _, entries = finished(r, store, outcome)
    return entries


def fallbacks(entries: list[dict], **match) -> list[dict]:
    """provider_fallback entries matching ``match``: of LLM calls, or of balance checkers when ``checker=`` is given."""
    return [e for e in events_of(entries, "provider_fallback")
            if ("checker" in e) == ("checker" in match) and all(e.get(k) == v for k, v in match.items())]


def ground_truth(entries: list[dict]) -> dict:
    (gt,) = events_of(entries, "ground_truth")
    return gt


def raw_dump(store) -> str:
    """Every byte the store holds under this test's namespace, as text (values, logs, metadata, history)."""
    if hasattr(store, "_r"):  # Redis: every key under the prefix, whatever its type
        out = []
        for k in store._r.scan_iter(match=store.prefix + "*", count=1000):
            kind = store._r.type(k)
            if kind == "string":
                out.append(store._r.get(k) or "")
            elif kind == "list":
                out.extend(store._r.lrange(k, 0, -1))
            elif kind == "hash":
                out.extend(f"{a}={b}" for a, b in store._r.hgetall(k).items())
            elif kind == "stream":
                out.extend(json.dumps(e) for e in store._r.xrange(k))
            elif kind in ("set", "zset"):
                out.extend(store._r.smembers(k) if kind == "set" else store._r.zrange(k, 0, -1))
            out.append(k)
        return "\n".join(map(str, out))
    db = sqlite3.connect(str(store.path))  # SQLite: every row of every table
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for t in tables for row in db.execute(f'SELECT * FROM "{t}"'))
    finally:
        db.close()


# --- tier 1 broken: every call falls through to the hard-coded client ------------------------------

@pytest.mark.parametrize("real_store_url, kind", on_stores(BROKEN_ADAPTERS, {"raises"}),
                         indirect=["real_store_url"])
def test_broken_tier1_adapter_falls_back_on_every_call_and_is_never_snapshotted(kind, real_store_url, st, llm):
    code, meta, error = BROKEN_ADAPTERS[kind]
    st.put(keys.PROVIDER_LLM_CODE, code)
    if meta is not None:
        st.put(keys.PROVIDER_LLM_META, meta)

    entries = one_session(llm, wake_env(real_store_url, llm), st)

    calls = llm_calls(entries)
    assert [c["purpose"] for c in calls] == ["orient", "think", "reflect"]
    assert {c["tier"] for c in calls} == {"hardcoded"}
    fb = fallbacks(entries, tier="dynamic")
    assert [f["purpose"] for f in fb] == ["orient", "think", "reflect"]  # one per call, before it
    for f in fb:
        assert error in f["error"], f
        assert f["error"].startswith("provider:llm:")
        if kind == "loops":  # killed at its meta's timeout_ms, not at the session's
            assert 450 <= f["duration_ms"] < 1500, f
    # Each fallback precedes the llm_call it led to.
    order = [(e["event"], e.get("purpose")) for e in entries if e["event"] in ("provider_fallback", "llm_call")]
    assert order == [(ev, p) for p in ("orient", "think", "reflect")
                     for ev in ("provider_fallback", "llm_call")]
    assert len(llm.requests) == 3  # the broken adapter never reached the server
    assert st.get(LAST_CODE) is None and st.get(LAST_META) is None
    assert not [e for e in events_of(entries, "kv_write") if e.get("key", "").startswith("provider:llm:last")]


def test_adapter_with_invalid_meta_is_left_out_once_with_the_field_named(real_store_url, st, llm):
    st.put(keys.PROVIDER_LLM_CODE, "def call(request, ctx):\n    return {'content': 'never used'}\n")
    st.put(keys.PROVIDER_LLM_META, json.dumps({"timeout_ms": "fast"}))
    entries = one_session(llm, wake_env(real_store_url, llm), st)
    (fb,) = fallbacks(entries)
    assert fb["tier"] == "dynamic"
    assert fb["error"].startswith("provider:llm:meta is invalid: timeout_ms:")
    assert {c["tier"] for c in llm_calls(entries)} == {"hardcoded"}
    assert st.get(LAST_CODE) is None


# --- tier 1 working, then broken: the snapshot carries the session --------------------------------

@pytest.mark.slow
def test_working_adapter_is_snapshotted_then_carries_the_agent_when_tier1_breaks(real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS=PROVIDER_SECRETS, BRAINSTEM_FETCH_ALLOW="127.0.0.1")
    r = run_cli("seed", "--with-providers", "--example-soul", env=env)
    assert r.returncode == 0, r.stderr
    from brainstem.store import open_store

    store = open_store(real_store_url)
    try:
        adapter = seeded_adapter_code()
        assert store.get(keys.PROVIDER_LLM_CODE) == adapter
        assert store.get(LAST_CODE) is None

        # Session 1: tier 1 answers every call. Its reflection breaks tier 1 (the agent may edit it).
        breaking = reflection("rewrote my adapter", kv_operations=[
            {"op": "put", "key": keys.PROVIDER_LLM_CODE, "value": RAISING_ADAPTER}])
        entries = one_session(llm, env, store, reflect=breaking)
        calls = llm_calls(entries)
        assert [c["purpose"] for c in calls] == ["orient", "think", "reflect"]
        assert {c["tier"] for c in calls} == {"dynamic"}
        assert not fallbacks(entries, tier="dynamic")
        # The requests went through the adapter's ctx.fetch (it sends no brainstem User-Agent;
        # the built-in client does).
        for h in llm.request_headers:
            assert h.get("Authorization") == f"Bearer {API_KEY}"
            assert h.get("X-Title") == "Brainstem" and not h.get("User-Agent", "").startswith("brainstem/")
        snap = [e for e in events_of(entries, "kv_write") if e.get("key") == LAST_CODE]
        assert len(snap) == 1 and snap[0]["source"] == "runtime"
        assert store.get(LAST_CODE) == adapter
        assert json.loads(store.get(LAST_META)) == json.loads(store.get(keys.PROVIDER_LLM_META))
        # The reflection's write to provider:llm:code is an ordinary privileged write, old value kept.
        edit = [e for e in events_of(entries, "kv_write") if e.get("key") == keys.PROVIDER_LLM_CODE]
        assert len(edit) == 1 and edit[0]["source"] == "reflect" and edit[0]["old_value"] == adapter
        assert store.get(keys.PROVIDER_LLM_CODE) == RAISING_ADAPTER

        # Session 2: tier 1 raises on every call, the snapshot answers; nothing reaches the hard-coded client.
        entries = one_session(llm, env, store)
        calls = llm_calls(entries)
        assert [c["purpose"] for c in calls] == ["orient", "think", "reflect"]
        assert {c["tier"] for c in calls} == {"last_working"}
        fb = fallbacks(entries)
        assert [(f["tier"], f["purpose"]) for f in fb] == [("dynamic", p) for p in ("orient", "think", "reflect")]
        assert all("tier one is broken" in f["error"] for f in fb)
        for h in llm.request_headers:
            # the snapshot's own ctx.fetch, not the built-in client
            assert not h.get("User-Agent", "").startswith("brainstem/")
        # The snapshot is still the code that worked; the broken code is not snapshotted.
        assert store.get(LAST_CODE) == adapter
        assert not [e for e in events_of(entries, "kv_write") if e.get("key") == LAST_CODE]
    finally:
        store.close()


def test_seeded_adapter_without_granted_secret_fails_clearly_and_session_completes(real_store_url, st, llm):
    seed(st, with_providers=True)
    env = wake_env(real_store_url, llm, BRAINSTEM_FETCH_ALLOW="127.0.0.1")  # BRAINSTEM_TOOL_SECRETS unset
    entries = one_session(llm, env, st)

    denied = [e for e in events_of(entries, "secret_not_granted") if e.get("tool") == "provider:llm"]
    assert {e["secret_name"] for e in denied} == {"OPENROUTER_API_KEY"}
    assert all("not bound in BRAINSTEM_TOOL_SECRETS" in e["reason"] for e in denied)
    fb = fallbacks(entries, tier="dynamic", purpose="orient")
    assert len(fb) == 1
    assert "OPENROUTER_API_KEY is not granted" in fb[0]["error"]
    assert "BRAINSTEM_TOOL_SECRETS" in fb[0]["error"]
    assert {c["tier"] for c in llm_calls(entries)} == {"hardcoded"}
    assert st.get(LAST_CODE) is None


def test_seeded_adapter_is_refused_loopback_unless_the_operator_allows_it(real_store_url, st, llm):
    """Granted the key but not BRAINSTEM_FETCH_ALLOW: the egress policy refuses the double's loopback address."""
    seed(st, with_providers=True)
    env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS=PROVIDER_SECRETS)
    entries = one_session(llm, env, st)
    fb = fallbacks(entries, tier="dynamic", purpose="orient")
    assert len(fb) == 1 and "127.0.0.1" in fb[0]["error"], fb
    assert {c["tier"] for c in llm_calls(entries)} == {"hardcoded"}
    for h in llm.request_headers:
        assert h.get("User-Agent", "").startswith("brainstem/")  # only the built-in client got through
    assert st.get(LAST_CODE) is None


# --- the snapshot is the runtime's alone ---------------------------------------------------------

SNAPSHOT_ATTACKS = {
    "put": [{"op": "put", "key": LAST_CODE, "value": RAISING_ADAPTER}],
    "put-meta-in-a-batch": [{"op": "put", "key": "wisdom", "value": "fine"},
                            {"op": "put", "key": LAST_META, "value": {"secrets": ["OPENROUTER_API_KEY"]}}],
    "rename-into": [{"op": "rename", "key": keys.PROVIDER_LLM_CODE, "value": LAST_CODE}],
    "delete": [{"op": "delete", "key": LAST_CODE}],
}


@pytest.mark.parametrize("real_store_url, attack", on_stores(SNAPSHOT_ATTACKS, {"put"}),
                         indirect=["real_store_url"])
def test_reflection_cannot_touch_the_last_working_snapshot(attack, real_store_url, st, llm):
    ops = SNAPSHOT_ATTACKS[attack]
    good, good_meta = seeded_adapter_code(), seeded_adapter_meta()
    st.put(LAST_CODE, good)  # as the runtime left them after an earlier success
    st.put(LAST_META, good_meta)
    st.put(keys.PROVIDER_LLM_CODE, RAISING_ADAPTER)
    wisdom_before = st.get(keys.WISDOM)
    env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS=PROVIDER_SECRETS, BRAINSTEM_FETCH_ALLOW="127.0.0.1")

    entries = one_session(llm, env, st, reflect=reflection("trying to rewrite my safety net", kv_operations=ops))

    (rejected,) = events_of(entries, "kv_operations_rejected")
    assert rejected["source"] == "reflect"
    assert "owned by the runtime" in rejected["reason"]
    assert st.get(LAST_CODE) == good
    assert st.get(LAST_META) == good_meta
    assert st.get(keys.PROVIDER_LLM_CODE) == RAISING_ADAPTER
    assert st.get(keys.WISDOM) == wisdom_before  # the batch is rejected whole
    # The snapshot (tier 2) answered every call after tier 1 failed.
    assert {c["tier"] for c in llm_calls(entries)} == {"last_working"}
    # The reflection's other effects still apply.
    assert st.get_json(keys.LAST_REFLECT)["session_summary"] == "trying to rewrite my safety net"


# --- secrets ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_api_key_given_to_adapters_never_reaches_karma_or_the_store(real_store_url, llm):
    store = seeded(real_store_url)
    try:
        seed(store, with_providers=True)
        env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS=PROVIDER_SECRETS,
                       BRAINSTEM_FETCH_ALLOW="127.0.0.1")
        # Session 1: the seeded adapter and credit checker use the key.
        entries = one_session(llm, env, store)
        assert {c["tier"] for c in llm_calls(entries)} == {"dynamic"}
        assert all(h.get("Authorization") == f"Bearer {API_KEY}" for h in llm.request_headers)
        assert [p for p, h in llm.get_requests if h.get("Authorization") == f"Bearer {API_KEY}"]

        # Session 2: a careless (or hostile) tier 1 logs the key, and a store secret it is bound to,
        # and puts them in its error message; so does the credit checker. They hold placeholders only.
        store.put("secret:relay", RELAY_TOKEN)
        env = {**env, "BRAINSTEM_TOOL_SECRETS": f"{PROVIDER_SECRETS},secret:relay@127.0.0.1"}
        store.put(keys.PROVIDER_LLM_META, json.dumps({"secrets": ["OPENROUTER_API_KEY"], "kv_secrets": ["relay"]}))
        store.put(keys.PROVIDER_LLM_CODE,
                  "def call(request, ctx):\n"
                  "    key = ctx.secrets['OPENROUTER_API_KEY']\n"
                  "    ctx.log('using key ' + key + ' via relay ' + ctx.secrets['relay'])\n"
                  "    raise RuntimeError('provider refused key ' + key + ' and ' + ctx.secrets['relay'])\n")
        store.put("provider:llm_balance:meta", store.get(keys.PROVIDER_LLM_META))
        store.put(keys.PROVIDER_LLM_BALANCE_CODE,
                  "def check(ctx):\n"
                  "    ctx.log('checking with ' + ctx.secrets['OPENROUTER_API_KEY'] + ' ' + ctx.secrets['relay'])\n"
                  "    raise RuntimeError('no credit for ' + ctx.secrets['relay'])\n")
        entries = one_session(llm, env, store)
        (cfb,) = fallbacks(entries, checker="llm_balance")
        assert "no credit for brainstem-secret-secret.relay-" in cfb["error"]
        (clog,) = [e for e in events_of(entries, "tool_log") if e.get("tool") == "provider:llm_balance"]
        assert clog["message"].startswith("checking with brainstem-secret-OPENROUTER_API_KEY-")
        assert {c["tier"] for c in llm_calls(entries)} == {"last_working"}
        fb = fallbacks(entries, tier="dynamic")
        assert fb  # it held both, and karma holds neither value: only the placeholders
        for text in [f["error"] for f in fb] + [e["message"] for e in events_of(entries, "tool_log")
                                                 if e.get("tool") == "provider:llm"]:
            assert "brainstem-secret-OPENROUTER_API_KEY-" in text and "brainstem-secret-secret.relay-" in text, text
        r = run_cli("karma", "--json", env=env)
        assert r.returncode == 0 and RELAY_TOKEN not in r.stdout
        store.delete("secret:relay")  # the one place it belongs

        dump = raw_dump(store)
        assert "session_start" in dump and "brainstem-secret-OPENROUTER_API_KEY" in dump  # the dump covers karma
        for secret in (API_KEY, RELAY_TOKEN):
            assert secret not in dump
            assert secret[4:20] not in dump
        r = run_cli("karma", "--json", env=env)
        assert r.returncode == 0 and API_KEY not in r.stdout + r.stderr
    finally:
        store.close()


# --- balance checkers ---------------------------------------------------------------------------------

def test_llm_balance_comes_from_the_agents_checker(real_store_url, st, llm):
    seed(st, with_providers=True)
    llm.credit = 31.4159
    env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS=PROVIDER_SECRETS, BRAINSTEM_FETCH_ALLOW="127.0.0.1")
    entries = one_session(llm, env, st)

    assert ground_truth(entries)["balances"]["openrouter"] == pytest.approx(31.4159)
    assert not fallbacks(entries, checker="llm_balance")
    key_gets = [h for p, h in llm.get_requests if p.endswith("/key")]
    assert len(key_gets) == 1  # the checker's, and the hard-coded fallback never ran
    assert key_gets[0]["Authorization"] == f"Bearer {API_KEY}"
    assert not key_gets[0].get("User-Agent", "").startswith("brainstem/")


BROKEN_CHECKERS = {
    "raises": ("def check(ctx):\n    raise RuntimeError('checker broke')\n", "RuntimeError: checker broke"),
    "not-a-number": ("def check(ctx):\n    return 'plenty'\n", "check() returned str, not a number"),
    "bool": ("def check(ctx):\n    return True\n", "check() returned bool, not a number"),
    "syntax-error": ("def check(ctx):\n    return (\n", "SyntaxError"),
    # Killed at half the ground-truth timeout (1 s here), not its meta's 10 s, so the fallback has the rest.
    "loops": ("def check(ctx):\n    while True:\n        pass\n", "timed out after 500 ms"),
}


@pytest.mark.parametrize("real_store_url, kind", on_stores(BROKEN_CHECKERS, {"raises"}),
                         indirect=["real_store_url"])
def test_broken_llm_balance_checker_falls_back_to_the_hardcoded_one(kind, real_store_url, st, llm):
    code, error = BROKEN_CHECKERS[kind]
    st.put(keys.PROVIDER_LLM_BALANCE_CODE, code)
    st.put("provider:llm_balance:meta", json.dumps({"timeout_ms": 10_000}))
    llm.credit = 27.1828
    entries = one_session(llm, wake_env(real_store_url, llm, BRAINSTEM_GROUND_TRUTH_TIMEOUT=1), st)

    fb = fallbacks(entries, checker="llm_balance")
    assert len(fb) == 1 and fb[0]["tier"] == "dynamic"
    assert error in fb[0]["error"], fb[0]
    assert ground_truth(entries)["balances"]["openrouter"] == pytest.approx(27.1828)
    key_gets = [h for p, h in llm.get_requests if p.endswith("/key")]
    # the built-in client's request
    assert len(key_gets) == 1 and key_gets[0].get("User-Agent", "").startswith("brainstem/")


def test_broken_llm_balance_checker_with_no_credit_known_gives_null(real_store_url, st, llm):
    st.put(keys.PROVIDER_LLM_BALANCE_CODE, "def check(ctx):\n    return None\n")
    llm.key_status = 500
    llm.credits_status = 500
    entries = one_session(llm, wake_env(real_store_url, llm), st)
    fb = fallbacks(entries, checker="llm_balance")
    assert len(fb) == 1 and "returned None" in fb[0]["error"]
    assert ground_truth(entries)["balances"]["openrouter"] is None


def test_wallet_balance_checker_reads_usdc_through_the_sandbox(real_store_url, st, llm):
    seed(st, with_providers=True)
    with RPCDouble({WALLET: 1_234_567_891}) as rpc:
        # WALLET_ADDRESS and BASE_RPC_URL are operator settings, not secrets: code that asks gets them.
        env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS=PROVIDER_SECRETS,
                       BRAINSTEM_FETCH_ALLOW="127.0.0.1", WALLET_ADDRESS=WALLET, BASE_RPC_URL=rpc.url)
        entries = one_session(llm, env, st)
        calls = list(rpc.eth_calls)

    assert ground_truth(entries)["balances"]["wallet_usdc"] == pytest.approx(1234.567891)
    assert not fallbacks(entries, checker="wallet_balance")
    assert len(calls) == 1  # the checker's one eth_call; the hard-coded web3 fallback never ran
    call = calls[0][0]
    assert call["to"].lower() == "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"
    assert call["data"] == "0x70a08231" + WALLET[2:].lower().rjust(64, "0")


NONSENSE_BALANCES = {"negative": "-5", "nan": "float('nan')", "inf": "float('inf')", "absurd": "1e20"}


@pytest.mark.slow
@pytest.mark.parametrize("nonsense", list(NONSENSE_BALANCES))
@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)  # imports web3: one store is enough
def test_a_checkers_nonsense_balance_is_unknown_and_the_hardcoded_reader_answers(nonsense, real_store_url, st, llm):
    st.put(keys.PROVIDER_WALLET_BALANCE_CODE, f"def check(ctx):\n    return {NONSENSE_BALANCES[nonsense]}\n")
    with RPCDouble({WALLET: 5_000_000}) as rpc:
        env = wake_env(real_store_url, llm, WALLET_ADDRESS=WALLET, BASE_RPC_URL=rpc.url)
        entries = one_session(llm, env, st)
    (fb,) = fallbacks(entries, checker="wallet_balance")
    # NaN and infinity never even cross the sandbox boundary (not JSON); the others are judged here.
    assert "check() returned" in fb["error"] or "not JSON" in fb["error"], fb
    assert ground_truth(entries)["balances"]["wallet_usdc"] == pytest.approx(5.0)


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_an_adapter_cannot_make_its_calls_free_by_under_reporting_usage(real_store_url, st, llm):
    lying = seeded_adapter_code()
    for field in ('"cost": usage.get("cost")', '"prompt_tokens": usage.get("prompt_tokens", 0)',
                  '"completion_tokens": usage.get("completion_tokens", 0)'):
        assert field in lying
        lying = lying.replace(field, field.split(":")[0] + ": 0")
    st.put(keys.PROVIDER_LLM_CODE, lying)
    st.put(keys.PROVIDER_LLM_META, seeded_adapter_meta())
    env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS=PROVIDER_SECRETS, BRAINSTEM_FETCH_ALLOW="127.0.0.1")
    llm.queue(plan(think("Write a long essay.")))
    llm.responder = answers("x" * 4000)
    r = run_wake(env, "--force")
    _, entries = finished(r, st)
    calls = llm_calls(entries)
    assert calls and {c["tier"] for c in calls} == {"dynamic"}
    assert all(c["cost"] > 0 for c in calls), [(c["purpose"], c["cost"]) for c in calls]
