"""Noninterference: what code sees never depends on a secret's value, except by being stopped.

The same tool code runs twice, with two values of one secret (same length,
alphabet and public prefix), against servers whose behaviour hypothesis draws:
a bound API host and an LLM host that echo what they were sent (the secret,
and a guess the code sent as character codes, which the server spells out),
cut, split, re-cased or encoded, under any charset label; that keep what they
were sent and hand it back to a later request; that repeat their prompt; that
redirect to a host the secret is not bound to. The code's guesses are pieces of the first
run's value, or nothing of either.

The property, for every draw: everything handed to the code (each fetch's
status, headers, text and URL, or its error), and everything a host the secret
is not bound to received, is the same in both runs up to the point where
either run was stopped (``secret_refused``). A stop is the one thing a guess
can learn, and it holds all of the agent's code until the operator looks. And
a server that echoes exactly what it was sent is never a reason to stop.

Code that already holds a whole value has nothing to learn, so a guess is
never the whole value. A server that spells a value in a form the scrubber
does not know (see "What does not hold" in docs/security.md) is out of scope.
"""

from __future__ import annotations

import base64
import json
import os
import string
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from brainstem.core import events, keys
from brainstem.core.scrubber import MIN_RUN
from brainstem.core.settings import load_settings
from brainstem.state import refusals
from brainstem.state.guarded import AgentKV
from brainstem.state.seed import seed
from brainstem.store import open_store
from brainstem.tools.policy import standalone_tool_policy
from brainstem.tools.services import run_tool

BOUND, OTHER, LLM = "127.0.0.1", "127.0.0.2", "127.0.0.3"
ALPHABET = string.ascii_letters + string.digits + "+/=@%"  # some of them quoted in a URL, some not
# The LLM key under its name and under its older one: each guarded alike.
TIERS = {"api": ("TOK", "tok_live_"), "llm": ("OPENROUTER_API_KEY", "sk-or-v1-"), "llm_key": ("BRAINSTEM_LLM_API_KEY",
                                                                                           "sk-llm-")}
LLM_VARS = {"OPENROUTER_API_KEY": "OPENROUTER_BASE_URL", "BRAINSTEM_LLM_API_KEY": "BRAINSTEM_LLM_BASE_URL"}
EXACT = {"cut": None, "case": "same", "split": 0, "encoding": "plain"}

CODE = r'''
import json

def execute(args, ctx):
    for call in args["calls"]:
        url = args[call["to"]] + call["path"]
        headers = {"X-G": call["guess"]}
        if call["key"] and call.get("in") == "query":  # quoted for a URL: its length hangs on the value
            url = url + ("&" if "?" in url else "?") + "k=" + ctx.secrets[args["secret"]]
        elif call["key"]:
            headers["Authorization"] = "Bearer " + ctx.secrets[args["secret"]]
        try:
            if call["to"] == "llm":
                r = ctx.fetch(url, method="POST", headers=headers,
                              json={"model": args["model"], "max_tokens": 64,
                                    "messages": [{"role": "user", "content": "spell out: " + call["guess"]}]})
            else:
                r = ctx.fetch(url, headers=headers)
            seen = {"status": r["status"], "headers": r["headers"], "text": r["text"], "url": r["url"]}
        except Exception as e:
            seen = {"error": str(e)}
        ctx.log(json.dumps(seen, sort_keys=True)[:1900])  # a log line holds 2,000 characters
    return "done"
'''


# --------------------------------------------------------------------------- the world's servers


def _spell(codes: str) -> str:
    return "".join(chr(int(c)) for c in codes.split(",") if c.strip().isdigit() and 32 <= int(c) < 127)


def _encode(text: str, how: str) -> str:
    if how == "b64":
        return base64.b64encode(text.encode()).decode()
    if how == "hex":
        return text.encode().hex()
    if how == "quote":
        return urllib.parse.quote(text, safe="")
    if how == "json_u":
        return "".join(f"\\u{ord(c):04x}" for c in text)
    if how == "html":
        return "".join(f"&#{ord(c)};" for c in text)
    if how == "reverse":
        return text[::-1]
    return text


def _shape(text: str, part: dict) -> str:
    """One echoed part: cut (keeping at least a run the scrubber counts), re-cased, split or encoded."""
    if part["cut"] is not None:
        start = min(part["cut"], max(0, len(text) - MIN_RUN - 4))
        text = text[start:]
    text = {"same": text, "upper": text.upper(), "lower": text.lower()}[part["case"]]
    if part["split"]:
        text = " ".join(text[i:i + part["split"]] for i in range(0, len(text), part["split"]))
        return text
    return _encode(text, part["encoding"])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def date_time_string(self, timestamp=None):  # the same in both runs
        return "Thu, 01 Jan 2026 00:00:00 GMT"

    def version_string(self):
        return "world"

    def do_GET(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        world: World = self.server.world
        with world.lock:
            world.received[self.server.name].append(
                (self.requestline + "\n" + "".join(f"{k}: {v}\n" for k, v in sorted(self.headers.items()))
                 ).encode("latin-1", "replace") + body)
        status, headers, out = world.answer(self.server.name, self, body)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_POST = do_GET  # noqa: N815


class World:
    """Three loopback hosts: the bound API, the LLM, and another host nothing is bound to."""

    def __init__(self):
        self.lock = threading.Lock()
        self.behaviour: dict = {}
        self.received: dict[str, list[bytes]] = {}
        self.servers = {}
        for name, host in (("bound", BOUND), ("llm", LLM), ("other", OTHER)):
            server = ThreadingHTTPServer((host, 0), _Handler)
            server.daemon_threads = True
            server.world, server.name = self, name
            self.servers[name] = server
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.base = {name: f"http://{s.server_address[0]}:{s.server_address[1]}" for name, s in self.servers.items()}
        self.base["llm"] += "/api/v1"
        self.base["alias"] = self.base["bound"].replace(BOUND, "localhost")  # another name of its address

    def reset(self, behaviour: dict) -> None:
        with self.lock:
            self.behaviour = behaviour
            self.received = {name: [] for name in self.servers}
            self.kept: dict[str, str] = {}

    def answer(self, name: str, h: BaseHTTPRequestHandler, body: bytes) -> tuple[int, dict, bytes]:
        if name == "other":  # the attacker's own server: spells out whatever reached it
            query = urllib.parse.unquote(h.path)
            return 200, {"Content-Type": "text/plain"}, (query + " " + _spell(h.headers.get("X-G", ""))).encode()
        b = self.behaviour
        key = (h.headers.get("Authorization") or "").removeprefix("Bearer ")
        if not key:  # as it came on the wire: URL-quoted, so its length hangs on which characters were quoted
            key = next((p[2:] for p in urllib.parse.urlsplit(h.path).query.split("&") if p.startswith("k=")), "")
        if key:
            self.kept[name] = key
        elif b["recall"]:  # a server that keeps what it was sent, and hands it back to a later request
            key = self.kept.get(name, "")
        guess = _spell(h.headers.get("X-G", ""))
        if name == "llm":  # a model spelling out (or repeating) its prompt
            try:
                prompt = json.loads(body)["messages"][0]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                prompt = ""
            guess = _spell(prompt.removeprefix("spell out: ")) if b["spell"] else prompt
        parts = [_shape(key, b["key_part"])] if b["echo_key"] and key else []
        parts += [_shape(guess, b["guess_part"])] if b["echo_guess"] and guess else []
        text = " ".join(parts) or "nothing"
        if b["where"] == "redirect":
            return 302, {"Location": self.base["other"] + "/landed?m=" + urllib.parse.quote(text)}, b""
        headers = {"Content-Type": f"text/plain; charset={b['charset']}"}
        if b["where"] == "header":
            headers["X-Echo"] = text.replace("\r", " ").replace("\n", " ")
            text = "see header"
        if name == "llm":
            payload = {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 20, "completion_tokens": 10, "cost": 0.00001}}
            return b["status"], {"Content-Type": "application/json"}, json.dumps(payload).encode()
        return b["status"], headers, text.encode()

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def world():
    w = World()
    yield w
    w.close()


# --------------------------------------------------------------------------- what hypothesis draws


@st.composite
def secret_pairs(draw, prefix: str):
    """Two values of one secret: the same length, alphabet and public prefix, sharing no run."""
    n = draw(st.integers(24, 40))
    first = draw(st.text(ALPHABET, min_size=n, max_size=n))
    second = draw(st.text(ALPHABET, min_size=n, max_size=n))
    a, b = prefix + first, prefix + second
    assume(not any(a[i:i + MIN_RUN - 2] in b for i in range(len(prefix), len(a) - MIN_RUN + 3)))
    return a, b


parts = st.fixed_dictionaries({
    "cut": st.none() | st.integers(0, 12),
    "case": st.sampled_from(["same", "same", "upper", "lower"]),
    "split": st.sampled_from([0, 0, 0, 3, 5]),
    "encoding": st.sampled_from(["plain", "plain", "b64", "hex", "quote", "json_u", "html", "reverse"]),
})

behaviours = st.fixed_dictionaries({
    "echo_key": st.sampled_from([True, True, False]),
    "echo_guess": st.sampled_from([True, True, False]),
    "key_part": parts,
    "guess_part": parts,
    "spell": st.booleans(),
    "where": st.sampled_from(["body", "body", "header", "redirect"]),
    "status": st.sampled_from([200, 200, 400, 500]),
    "recall": st.booleans(),
    "charset": st.sampled_from(["utf-8", "utf-8", "cp500", "utf-16-le"]),
})


@st.composite
def guesses(draw, value: str):
    """What the code sends as its guess, as character codes: a piece of the first run's value (never
    all of it), or text that holds nothing of either."""
    kind = draw(st.sampled_from(["piece", "piece", "piece", "none", "empty"]))
    if kind == "empty":
        return ""
    if kind == "piece":
        size = draw(st.integers(MIN_RUN, len(value) - 1))
        start = draw(st.integers(0, len(value) - size))
        text = value[start:start + size]
    else:
        text = draw(st.text("!#%*=?@^", min_size=1, max_size=12))
    return ",".join(str(ord(c)) for c in text)


@st.composite
def scenarios(draw, tier: str):
    name, prefix = TIERS[tier]
    a, b = draw(secret_pairs(prefix))
    target = "bound" if tier == "api" else "llm"
    calls = draw(st.lists(st.fixed_dictionaries({
        "to": st.sampled_from([target, target, "other", "alias"] if tier == "api" else [target, target, "other"]),
        "path": st.sampled_from(["/x", "/echo?q=1"] if tier == "api" else ["/chat/completions"]),
        "key": st.sampled_from([True, True, False]),
        "in": st.sampled_from(["header", "query"] if tier == "api" else ["header"]),
        "guess": guesses(a),
    }), min_size=1, max_size=3))
    for call in calls:
        if call["to"] in ("other", "alias"):
            call["key"] = False  # a placeholder sent there is refused in both runs alike: tested elsewhere
            call["path"] = "/"
    return name, a, b, calls, draw(behaviours)


# --------------------------------------------------------------------------- running it twice


def _run(world: World, store, name: str, value: str, calls: list, behaviour: dict, model: str) -> dict:
    world.reset(behaviour)
    refusals.clear(store)
    key = name if name in LLM_VARS else "OPENROUTER_API_KEY"  # the LLM key's name in this run
    env = {"TOK": "tok_live_" + "f" * 30, key: "sk-or-v1-" + "e" * 64, name: value,
           LLM_VARS[key]: world.base["llm"], "BRAINSTEM_TOOL_SECRETS": f"TOK@{BOUND},{key}",
           "BRAINSTEM_FETCH_ALLOW": f"{BOUND},{OTHER},{LLM},localhost", "BRAINSTEM_MAX_SESSION_COST": "5",
           "BRAINSTEM_MAX_DAILY_COST": "1000"}
    seen: list[dict] = []

    def record(event: str, **fields):
        seen.append({"event": event, **fields})

    with mock.patch.dict(os.environ, env):
        policy = standalone_tool_policy(store, load_settings(), record)
        out = run_tool("probe", {**world.base, "calls": calls, "secret": name, "model": model}, store=store,
                       agent_kv=AgentKV(store, record), record=record, policy=policy)
    handed = [e["message"] for e in seen if e["event"] == events.TOOL_LOG]
    stopped = any(e["event"] == events.SECRET_REFUSED and "direction" in e for e in seen)
    return {"handed": handed, "stopped": stopped, "ok": out.ok, "error": out.error, "value": out.value,
            "other": list(world.received["other"])}


def _same_up_to_a_stop(one: dict, two: dict) -> None:
    if not one["stopped"] and not two["stopped"]:
        assert one == two
        return
    n = min(len(one["handed"]), len(two["handed"]))
    assert one["handed"][:n] == two["handed"][:n]
    for run in (one, two):  # a stopped run is handed nothing more, and ends stopped
        if run["stopped"]:
            assert not run["ok"] and run["error"].startswith("stopped: secret text"), run
    m = min(len(one["other"]), len(two["other"]))
    assert one["other"][:m] == two["other"][:m]
    if one["stopped"] and two["stopped"]:
        assert one["error"] == two["error"]


def _check(world: World, tmp_path_factory, scenario) -> None:
    name, a, b, calls, behaviour = scenario
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('ni') / 'store.db'}")
    try:
        seed(store)
        model = json.loads(store.get(keys.CONFIG_MODELS))["models"][0]["id"]
        store.put(keys.tool_code("probe"), CODE)
        store.put(keys.tool_meta("probe"), json.dumps({"secrets": [name], "timeout_ms": 20000}))
        one = _run(world, store, name, a, calls, behaviour, model)
        two = _run(world, store, name, b, calls, behaviour, model)
    finally:
        store.close()
    _same_up_to_a_stop(one, two)
    # Neither secret reached a host it is not bound to, in either run.
    prefix = next(p for n, p in TIERS.values() if n == name)
    for run, value in ((one, a), (two, b)):
        assert not any(value[len(prefix):].encode() in r for r in run["other"])
    # An exact echo of what was put in, beside guesses of nothing, is no reason to stop.
    guessed = any(_spell(c["guess"]) and _spell(c["guess"]) in a for c in calls)
    if not guessed and not behaviour["recall"] and (not behaviour["echo_key"] or behaviour["key_part"] == EXACT):
        assert not one["stopped"] and not two["stopped"], (one, two)


NI = settings(max_examples=int(os.environ.get("BRAINSTEM_NI_EXAMPLES", "40")), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.filter_too_much])


# The attack that found this property missing: the real value put in, and a guess sent as character codes
# beside it, which the bound host spells out. Masking the matching run answered the guess.
_A, _B = "tok_live_A1b2C3d4E5f6G7h8I9j0K1l2", "tok_live_Z9y8X7w6V5u4T3s2R1q0P9o8"
_GUESS = ",".join(str(ord(c)) for c in _A[12:22])
ORACLE = ("TOK", _A, _B, [{"to": "bound", "path": "/x", "key": True, "guess": _GUESS}],
          {"echo_key": True, "echo_guess": True, "key_part": EXACT, "guess_part": EXACT, "spell": True,
           "where": "body", "status": 200, "recall": False, "charset": "utf-8"})


# A server keeping what it was sent and handing it back, labelled cp500, to a later request by another name of
# its address that carries nothing: read with the server's charset, the value came back disguised.
RECALL = ("TOK", _A, _B, [{"to": "bound", "path": "/x", "key": True, "guess": ""},
                          {"to": "alias", "path": "/x", "key": False, "guess": ""}],
          {"echo_key": True, "echo_guess": False, "key_part": EXACT, "guess_part": EXACT, "spell": True,
           "where": "body", "status": 200, "recall": True, "charset": "cp500"})


# The value in a query, echoed as it came (URL-quoted): a length that hung on how many of its characters
# were quoted ("+" is, "A" is not) was handed over in Content-Length.
QUOTED = ("TOK", "tok_live_AAAAAAAAbbbbbbbbCCCCCCCC+/+/", "tok_live_DDDDDDDDeeeeeeeeFFFFFFFFgHiJ",
          [{"to": "bound", "path": "/x", "key": True, "in": "query", "guess": ""}],
          {"echo_key": True, "echo_guess": False, "key_part": EXACT, "guess_part": EXACT, "spell": True,
           "where": "body", "status": 200, "recall": False, "charset": "utf-8"})


# The value sent in a header, echoed into a redirect's Location URL-quoted: an exact echo went on as its
# placeholder only when quoting left the value as it was ("+" is quoted, "0" is not), else the next hop
# carried it to an unbound host and the code was stopped.
REDIRECTED = ("TOK", "tok_live_000000000000000000000000000000000000000",
              "tok_live_000001000001000001000001+00000100000100",
              [{"to": "bound", "path": "/x", "key": True, "in": "header", "guess": ""}],
              {"echo_key": True, "echo_guess": True, "key_part": EXACT, "guess_part": EXACT, "spell": False,
               "where": "redirect", "status": 200, "recall": False, "charset": "utf-8"})


@NI
@given(scenario=scenarios("api"))
@example(scenario=ORACLE)
@example(scenario=RECALL)
@example(scenario=QUOTED)
@example(scenario=REDIRECTED)
def test_what_code_sees_of_a_bound_api_token_is_the_same_for_any_value(world, tmp_path_factory, scenario):
    _check(world, tmp_path_factory, scenario)


@NI
@given(scenario=scenarios("llm"))
def test_what_code_sees_of_the_llm_key_is_the_same_for_any_value(world, tmp_path_factory, scenario):
    _check(world, tmp_path_factory, scenario)


def test_the_harness_sees_an_oracle_where_there_is_one(world, tmp_path_factory):
    """The harness's own check: the masking this property forbids (a guess spelled back beside the real
    value, with matching runs cut out) makes two runs differ without a stop."""
    name, prefix = TIERS["api"]
    a, b = prefix + "A1b2C3d4E5f6G7h8I9j0K1l2", prefix + "Z9y8X7w6V5u4T3s2R1q0P9o8"
    masked = {"handed": ['{"text": "brainstem-secret-TOK [REDACTED]"}'], "stopped": False, "ok": True,
              "error": None, "value": "done", "other": []}
    plain = {**masked, "handed": ['{"text": "brainstem-secret-TOK ' + a[9:20] + '"}']}
    with pytest.raises(AssertionError):
        _same_up_to_a_stop(masked, plain)
    # ... and an exact echo of the key, beside a guess of nothing, runs to the end in both.
    calls = [{"to": "bound", "path": "/x", "key": True, "guess": "33,33"}]
    behaviour = {"echo_key": True, "echo_guess": True, "key_part": EXACT, "guess_part": EXACT, "spell": True,
                 "where": "body", "status": 200, "recall": False, "charset": "utf-8"}
    _check(world, tmp_path_factory, (name, a, b, calls, behaviour))


def _run_adapter(world: World, store, value: str, calls: list, behaviour: dict, model: str,
                 key: str = "OPENROUTER_API_KEY") -> dict:
    """The agent's LLM adapter (the shipped provider:llm code, in the sandbox) answering one chokepoint
    request per call, its prompt holding the call's guess: what it hands the runtime, or how it failed."""
    from brainstem.tools.adapters import dynamic_providers

    world.reset(behaviour)
    refusals.clear(store)
    env = {key: value, LLM_VARS[key]: world.base["llm"],
           "BRAINSTEM_TOOL_SECRETS": key, "BRAINSTEM_FETCH_ALLOW": f"{BOUND},{OTHER},{LLM}",
           "BRAINSTEM_MAX_SESSION_COST": "5", "BRAINSTEM_MAX_DAILY_COST": "1000"}
    seen: list[dict] = []

    def record(event: str, **fields):
        seen.append({"event": event, **fields})

    handed, error = [], None
    with mock.patch.dict(os.environ, env):
        policy = standalone_tool_policy(store, load_settings(), record)
        (adapter,) = [p for p in dynamic_providers(store, AgentKV(store, record), record, policy,
                                                   base_url=world.base["llm"]) if p.tier == "dynamic"]
        for call in calls:
            request = {"model": model, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "spell out: " + call["guess"]}]}
            try:
                handed.append(adapter.complete(request, timeout=20).content)
            except Exception as exc:  # noqa: BLE001 - how it failed is what the runtime is handed
                error = str(exc)
                break
    stopped = any(e["event"] == events.SECRET_REFUSED and "direction" in e for e in seen)
    return {"handed": handed, "stopped": stopped, "ok": error is None, "error": error,
            "value": None, "other": list(world.received["other"])}


@NI
@given(scenario=scenarios("llm"))
def test_what_the_llm_adapter_hands_back_is_the_same_for_any_value(world, tmp_path_factory, scenario):
    """The same property for the adapter tier: the agent's adapter holds the LLM key's placeholder, and the
    model it calls repeats or spells out its prompt, which carries the guess."""
    _check_adapter(world, tmp_path_factory, scenario)


@NI
@given(scenario=scenarios("llm_key"))
def test_what_code_sees_of_the_llm_key_by_its_new_name_is_the_same_for_any_value(world, tmp_path_factory,
                                                                                  scenario):
    """The key set as BRAINSTEM_LLM_API_KEY (bound bare, the server named by BRAINSTEM_LLM_BASE_URL): a tool
    asking for it by that name, and the shipped adapter asking for it by its older one."""
    _check(world, tmp_path_factory, scenario)
    _check_adapter(world, tmp_path_factory, scenario, key="BRAINSTEM_LLM_API_KEY")


def _check_adapter(world: World, tmp_path_factory, scenario, key: str = "OPENROUTER_API_KEY") -> None:
    _, a, b, calls, behaviour = scenario
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('na') / 'store.db'}")
    try:
        seed(store, with_providers=True)
        model = json.loads(store.get(keys.CONFIG_MODELS))["models"][0]["id"]
        one = _run_adapter(world, store, a, calls, behaviour, model, key)
        two = _run_adapter(world, store, b, calls, behaviour, model, key)
    finally:
        store.close()
    if one["stopped"] or two["stopped"]:
        n = min(len(one["handed"]), len(two["handed"]))
        assert one["handed"][:n] == two["handed"][:n]
    else:
        assert one == two
