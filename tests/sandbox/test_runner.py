"""Functional behaviour of brainstem.sandbox.run, and how it fails on bad tools."""

from __future__ import annotations

import time

import pytest

from brainstem.sandbox import Limits, Outcome, run, server_pid, shutdown
from tests.helpers import TRIVIAL, FakeServices, assert_runtime_healthy, tool

FAST = Limits(timeout_ms=5000)


def go(code, args=({},), services=None, limits=FAST, entry="execute") -> Outcome:
    return run(code, entry, list(args), services=services or FakeServices(), limits=limits)


# --------------------------------------------------------------------------- functional


def test_trivial_tool():
    o = go(TRIVIAL, [42])
    assert o.ok and o.value == {"ok": 42} and o.error is None
    assert o.duration_ms > 0


def test_args_and_ctx_round_trip():
    code = tool("""
        out = {"echo": args, "n": len(args["items"]), "ctx": repr(ctx)}
        out["sum"] = sum(args["items"])
        out["sorted"] = sorted(args["items"], reverse=True)
        out["pairs"] = [list(p) for p in zip(args["items"], reversed(args["items"]))]
        out["tuple"] = tuple(args["items"])
        out["isinst"] = isinstance(out["tuple"], (list, tuple)) and isinstance(args, dict)
        out["enum"] = dict(enumerate(["a", "b"]))  # int keys -> refused? no: converted below
        out["enum"] = {str(k): v for k, v in out["enum"].items()}
        return out
    """)
    args = {"items": [3, 1, 2], "nested": {"a": [None, True, 1.5, "x"]}}
    o = go(code, [args])
    assert o.ok, o
    assert o.value["echo"] == args
    assert o.value["n"] == 3 and o.value["sum"] == 6 and o.value["sorted"] == [3, 2, 1]
    assert o.value["pairs"] == [[3, 2], [1, 1], [2, 3]]
    assert o.value["tuple"] == [3, 1, 2] and o.value["isinst"] is True
    assert o.value["enum"] == {"0": "a", "1": "b"}
    assert o.value["ctx"] == "<ctx>"


def test_call_and_check_entrypoints():
    code = "def call(request, ctx):\n    return {'content': request['messages'][0], 'usage': {}}\n"
    o = run(code, "call", [{"messages": ["hi"]}], services=FakeServices(), limits=FAST)
    assert o.ok and o.value == {"content": "hi", "usage": {}}
    o = run("def check(ctx):\n    return 12.5\n", "check", [], services=FakeServices(), limits=FAST)
    assert o.ok and o.value == 12.5


def test_allowed_imports_work():
    code = tool("""
        out = {}
        out["json"] = json.dumps({"a": [1, 2]}, sort_keys=True)
        out["json_loads"] = json.loads('{"b": 2}')["b"]
        out["re"] = re.findall(r"\\d+", "a1b22c333")
        out["re_flags"] = bool(re.search("ABC", "xabcx", re.I))
        out["sqrt"] = math.sqrt(16.0)
        out["pi"] = round(math.pi, 3)
        now = datetime.datetime.now()
        out["year_ok"] = now.year >= 2024
        out["delta"] = (datetime.datetime(2024, 1, 2) - datetime.datetime(2024, 1, 1)).total_seconds()
        out["utc"] = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc).isoformat()
        out["parsed"] = datetime.datetime.strptime("2024-05-06", "%Y-%m-%d").day
        r = random.randint(1, 6)
        out["rand_ok"] = 1 <= r <= 6
        out["sha"] = hashlib.sha256(b"abc").hexdigest()
        out["b64"] = base64.b64encode(b"hello").decode()
        out["time_ok"] = time.time() > 1.6e9 and time.monotonic() > 0
        return out
    """, prelude="import json, re, math, datetime, random, hashlib, base64, time\n")
    o = go(code)
    assert o.ok, o
    v = o.value
    assert v["json"] == '{"a": [1, 2]}' and v["json_loads"] == 2
    assert v["re"] == ["1", "22", "333"] and v["re_flags"] is True
    assert v["sqrt"] == 4.0 and v["pi"] == 3.142
    assert v["year_ok"] and v["delta"] == 86400.0 and v["utc"] == "2024-01-01T00:00:00+00:00"
    assert v["parsed"] == 6 and v["rand_ok"]
    assert v["sha"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert v["b64"] == "aGVsbG8=" and v["time_ok"]


def test_from_import_and_alias():
    code = "from json import dumps as d\nimport math as m\ndef execute(args, ctx):\n    return d([m.floor(2.5)])\n"
    assert go(code).value == "[2]"


def test_random_differs_between_workers():
    code = "import random\ndef execute(args, ctx):\n    return random.getrandbits(64)\n"
    values = {go(code).value for _ in range(4)}
    assert len(values) == 4


def test_classes_and_own_object_writes():
    code = tool("""
        class Point:
            def __init__(self, x):
                self.x = x
        p = Point(3)
        p.y = 4
        return [p.x, p.y]
    """)
    assert go(code).value == [3, 4]


def test_print_is_collected():
    o = go(tool("print('hello', 1)\nprint('again')\nreturn 0"))
    assert o.ok and o.output == "hello 1\nagain\n"


def test_kv_relayed_to_services():
    s = FakeServices(kv_access="own", kv={"x": "1"})
    code = tool("""
        before = ctx.kv.get("x")
        ctx.kv.put("y", "2")
        ctx.kv.put("z", {"structured": [1]})
        keys = ctx.kv.list()
        some = ctx.kv.list("y")
        gone = ctx.kv.delete("x")
        missing = ctx.kv.get("x")
        return {"before": before, "keys": keys, "some": some, "gone": gone, "missing": missing}
    """)
    o = go(code, services=s)
    assert o.ok, o
    assert o.value == {"before": "1", "keys": ["x", "y", "z"], "some": ["y"], "gone": True, "missing": None}
    assert s.kv == {"y": "2", "z": '{"structured":[1]}'}
    assert ("kv_put", "y", "2") in s.calls and ("kv_list", "") in s.calls


def test_kv_read_all_grant():
    s = FakeServices(kv_access="read_all", kv={"a": "b"})
    assert go(tool("return ctx.kv.get('a')"), services=s).value == "b"


def test_kv_is_none_without_grant():
    s = FakeServices(kv_access="none", kv={"a": "b"})
    o = go(tool("return ctx.kv is None"), services=s)
    assert o.ok and o.value is True
    o = go(tool("return ctx.kv.get('a')"), services=s)
    assert not o.ok and "AttributeError" in o.error
    assert s.calls == []


def test_fetch_relayed():
    s = FakeServices(fetch_result={"status": 201, "headers": {"a": "b"}, "text": '{"k": 1}', "json": {"k": 1}})
    code = tool("""
        r = ctx.fetch("https://example.org/x", method="POST", headers={"X-A": "1"}, json={"q": [1]}, timeout=5)
        return r
    """)
    o = go(code, services=s)
    assert o.ok, o
    assert o.value == {"status": 201, "headers": {"a": "b"}, "text": '{"k": 1}', "json": {"k": 1}}
    name, url, method, headers, body, data, timeout = s.calls[0]
    assert (name, url, method, headers, body, data) == (
        "fetch", "https://example.org/x", "POST", {"X-A": "1"}, {"q": [1]}, None)
    assert 0 < timeout <= 5


def test_fetch_argument_types_checked():
    o = go(tool("return ctx.fetch('http://x', headers={'a': 1})"))
    assert not o.ok and "headers must be a dict of str to str" in o.error


def test_log_relayed():
    s = FakeServices()
    o = go(tool("ctx.log('step one')\nctx.log(42)\nreturn 1"), services=s)
    assert o.ok and s.logs == ["step one", "42"]


def test_services_error_becomes_catchable_runtime_error():
    s = FakeServices(kv_access="own", fail={"kv_get": KeyError("no such key: k"),
                                            "fetch": ConnectionError("connection refused")})
    code = tool("""
        out = []
        try:
            ctx.kv.get("k")
        except RuntimeError as e:
            out.append(str(e))
        try:
            ctx.fetch("https://example.org")
        except RuntimeError as e:
            out.append(str(e))
        return out
    """)
    o = go(code, services=s)
    assert o.ok, o
    assert o.value == ["'no such key: k'", "connection refused"]


def test_uncaught_services_error_fails_the_tool_only():
    s = FakeServices(kv_access="own", fail={"kv_get": ValueError("store is gone")})
    o = go(tool("ctx.kv.get('k')\nreturn 1"), services=s)
    assert not o.ok and o.error.startswith("RuntimeError: store is gone")
    assert_runtime_healthy()


def test_a_log_line_that_cannot_be_recorded_ends_the_call():
    """ctx.log is one-way (the tool does not wait for it), so a line the runtime cannot record cannot
    become the tool's exception: the call ends there, rather than run on with a hole in its log."""
    s = FakeServices(kv_access="own", fail={"log": ValueError("karma is full")})
    o = go(tool("ctx.log('x')\nctx.kv.put('after', 'yes')\nreturn 1"), services=s)
    assert not o.ok and o.error == "ctx.log failed: karma is full"
    assert "after" not in s.kv  # nothing the tool did after the lost line was served
    assert_runtime_healthy()


def test_log_lines_and_requests_arrive_in_the_order_the_tool_made_them():
    events = []

    class Recording(FakeServices):
        def log(self, message):
            events.append(("log", message))

        def kv_put(self, key, value):
            events.append(("put", key))

    s = Recording(kv_access="own")
    o = go(tool("for i in range(3):\n    ctx.log(str(i))\n    ctx.kv.put('k' + str(i), 'v')\nreturn 1"),
           services=s)
    assert o.ok, o
    assert events == [("log", "0"), ("put", "k0"), ("log", "1"), ("put", "k1"), ("log", "2"), ("put", "k2")]


def test_secrets_readable_and_immutable():
    s = FakeServices(secrets={"API_KEY": "sk-123", "OTHER": "x"})
    code = tool("""
        out = {"key": ctx.secrets["API_KEY"], "get": ctx.secrets.get("NOPE", "dflt"),
               "has": "OTHER" in ctx.secrets, "keys": sorted(ctx.secrets.keys())}
        errors = []
        try:
            ctx.secrets["API_KEY"] = "changed"
        except TypeError:
            errors.append("TypeError")
        try:
            ctx.secrets = {}
        except TypeError:
            errors.append("TypeError")
        try:
            del ctx.secrets["OTHER"]
        except TypeError:
            errors.append("TypeError")
        copy = dict(ctx.secrets)
        copy["API_KEY"] = "local change"
        out["errors"] = errors
        out["after"] = ctx.secrets["API_KEY"]
        return out
    """)
    o = go(code, services=s)
    assert o.ok, o
    assert o.value["key"] == "sk-123" and o.value["get"] == "dflt" and o.value["has"] is True
    assert o.value["keys"] == ["API_KEY", "OTHER"]
    assert o.value["errors"] == ["TypeError", "TypeError", "TypeError"]
    assert o.value["after"] == "sk-123"
    assert s.secrets == {"API_KEY": "sk-123", "OTHER": "x"}


def test_ctx_call_cap():
    o = go(tool("""
        n = 0
        try:
            for i in range(1200):
                ctx.log("x")
                n += 1
        except RuntimeError as e:
            return [n, str(e)]
    """), limits=Limits(timeout_ms=10000))
    assert o.ok and o.value[0] == 1000 and "too many ctx calls" in o.value[1]


def test_run_is_thread_safe():
    from concurrent.futures import ThreadPoolExecutor

    code = "def execute(args, ctx):\n    ctx.log(str(args))\n    return args * 2\n"
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: go(code, [i]), range(16)))
    assert [o.value for o in outs] == [i * 2 for i in range(16)]


def test_fork_server_restarted_after_death():
    import os
    import signal

    assert go(TRIVIAL).ok
    pid = server_pid()
    assert pid
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    o = go(TRIVIAL, [2])
    assert o.ok and o.value == {"ok": 2}
    assert server_pid() != pid


# --------------------------------------------------------------------------- bad input


def test_syntax_error():
    o = go("def execute(args, ctx):\n    return 1\n\ndef broken(:\n    pass\n")
    assert not o.ok and o.error.startswith("SyntaxError: line 4")
    assert "\n" not in o.error


def test_restricted_construct_is_reported():
    o = go("def execute(args, ctx):\n    return args._private\n")
    assert not o.ok and o.error.startswith("not allowed: line 2")


def test_no_execute_defined():
    o = go("def run(args, ctx):\n    return 1\n")
    assert not o.ok and o.error == "no function execute() defined"
    o = go("execute = 5\n")
    assert not o.ok and o.error == "no function execute() defined"


def test_invalid_entrypoint_name():
    o = run(TRIVIAL, "_private", [], services=FakeServices())
    assert not o.ok and "invalid entry point" in o.error


@pytest.mark.parametrize(
    "expr, message",
    [
        ("{1, 2}", "result is not JSON: set is not allowed"),
        ("ctx", "result is not JSON: Ctx is not allowed"),
        ("float('nan')", "result is not JSON: NaN is not allowed"),
        ("[1, float('inf')]", "result is not JSON: Infinity is not allowed at result[1]"),
        ("{1: 'a'}", "result is not JSON: dict key of type int is not allowed"),
        ("{'a': {True: 1}}", "result is not JSON: dict key of type bool is not allowed at result['a']"),
        ("b'bytes'", "result is not JSON: bytes is not allowed"),
        ("execute", "result is not JSON: function is not allowed"),
    ],
)
def test_non_json_results(expr, message):
    o = go(tool(f"return {expr}"))
    assert not o.ok and o.error == message
    assert_runtime_healthy()


def test_str_subclass_with_lying_eq_is_refused():
    code = tool("""
        class Liar(str):
            def __eq__(self, other):
                return True
        return {"v": Liar("x")}
    """)
    o = go(code)
    assert not o.ok and o.error == "result is not JSON: Liar is not allowed at result['v']"
    code = tool("""
        class Key(str):
            pass
        return {Key("k"): 1}
    """)
    o = go(code)
    assert not o.ok and "dict key of type Key is not allowed" in o.error


def test_nesting_depth_capped():
    o = go(tool("x = []\nfor i in range(200):\n    x = [x]\nreturn x"))
    assert not o.ok and "nested deeper than" in o.error


def test_raises_value_error():
    o = go(tool("x = 1\nraise ValueError('bad input: ' + str(x))"))
    assert not o.ok and o.error == "ValueError: bad input: 1 (line 4)"


@pytest.mark.parametrize(
    "body, expected",
    [
        ("raise SystemExit(3)", "NameError"),
        ("raise KeyboardInterrupt()", "NameError"),
        ("raise GeneratorExit()", "NameError"),
        ("raise BaseException('out')", "BaseException: out"),
    ],
)
def test_raises_exit_like_exceptions(body, expected):
    o = go(tool(body))
    assert not o.ok and o.error.startswith(expected)
    assert_runtime_healthy()


def test_raises_base_exception_subclass():
    o = go(tool("class Bye(BaseException):\n    pass\nraise Bye('leaving')"))
    assert not o.ok and o.error.startswith("Bye: leaving")


def test_multiline_error_is_one_line():
    o = go(tool("raise ValueError('line one\\nline two\\n' + 'x' * 2000)"))
    assert not o.ok and "\n" not in o.error and len(o.error) <= 500


@pytest.mark.slow
def test_infinite_loop_killed():
    t = time.monotonic()
    o = go("def execute(args, ctx):\n    while True:\n        pass\n", limits=Limits(timeout_ms=1000))
    elapsed = time.monotonic() - t
    assert not o.ok and o.error == "timed out after 1000 ms"
    assert elapsed < 1000 / 1000 + 1
    assert_runtime_healthy()


def test_top_level_loop_killed():
    t = time.monotonic()
    o = go("while True:\n    pass\n", limits=Limits(timeout_ms=300))
    assert not o.ok and o.error == "timed out after 300 ms"
    assert time.monotonic() - t < 1.3


def test_sleep_bounded_by_timeout():
    o = go("import time\ndef execute(args, ctx):\n    time.sleep(60)\n", limits=Limits(timeout_ms=300))
    assert not o.ok and o.error == "timed out after 300 ms"


@pytest.mark.slow
def test_allocates_10_gb():
    o = go(tool("x = 'a' * (10 * 1024 ** 3)\nreturn len(x)"), limits=Limits(timeout_ms=10000, memory_mb=256))
    assert not o.ok and o.error == "memory limit (256 MB) exceeded"
    o = go(tool("""
        hoard = []
        while True:
            hoard.append('x' * 10_000_000)
    """), limits=Limits(timeout_ms=10000, memory_mb=256))
    assert not o.ok and o.error == "memory limit (256 MB) exceeded"
    assert_runtime_healthy()


def test_tries_to_fork():
    o = go(tool("import os\nreturn os.fork()"))
    assert not o.ok and o.error.startswith("ImportError: module os is not available in the sandbox")
    o = go(tool("import subprocess\nreturn 1"))
    assert not o.ok and "ImportError" in o.error


@pytest.mark.slow
def test_prints_100_mb():
    o = go(tool("chunk = 'x' * 1_000_000\nfor i in range(100):\n    print(chunk)\nreturn 1"),
           limits=Limits(timeout_ms=10000))
    assert not o.ok and o.error == "output limit (65536 bytes) exceeded"
    assert_runtime_healthy()


def test_logs_past_output_cap():
    o = go(tool("for i in range(100):\n    ctx.log('y' * 1000)\nreturn 1"),
           limits=Limits(timeout_ms=5000, max_output_bytes=10_000))
    assert not o.ok and o.error == "output limit (10000 bytes) exceeded"


def test_result_of_50_mb():
    o = go(tool("return 'x' * 50_000_000"), limits=Limits(timeout_ms=10000))
    assert not o.ok and o.error == "result too large (more than 1000000 bytes)"
    o = go(tool("return ['y' * 1000] * 50_000"), limits=Limits(timeout_ms=10000))
    assert not o.ok and "result too large" in o.error
    assert_runtime_healthy()


def test_deep_recursion():
    o = go(tool("def f(n):\n    return f(n + 1)\nreturn f(0)"))
    assert not o.ok and o.error == "RecursionError: maximum recursion depth exceeded"
    assert_runtime_healthy()


def test_args_must_be_json():
    o = run(TRIVIAL, "execute", [{1, 2}], services=FakeServices())
    assert not o.ok and o.error == "args is not JSON: set is not allowed at args[0]"


def test_server_started_from_short_lived_thread_survives_it():
    # PR_SET_PDEATHSIG follows the *thread* that forked; the server must be
    # started from a thread that lives as long as the process.
    import threading

    shutdown()
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("o", go(TRIVIAL, [1])))
    t.start()
    t.join()
    assert box["o"].ok
    pid = server_pid()
    time.sleep(0.2)
    assert server_pid() == pid
    assert go(TRIVIAL, [2]).ok and server_pid() == pid


def test_shutdown_stops_the_fork_server():
    assert go(TRIVIAL).ok
    pid = server_pid()
    shutdown()
    assert server_pid() is None
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1][0] in "ZX":
                    break
        except OSError:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("fork server still running after shutdown()")
    assert go(TRIVIAL).ok  # and it comes back on demand
