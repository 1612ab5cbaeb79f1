"""Benchmark: the cost of a sandboxed tool call.

Prints the median wall time of
  * a trivial sandboxed call, with the kernel isolation of the workers on
    (network namespace, seccomp, Landlock, reduced capabilities: see
    brainstem/sandbox/kernel/) and, for comparison, with it switched off
    (BRAINSTEM_SANDBOX_ISOLATION=off, which only the bench and the tests use:
    it weakens the sandbox); the two are measured in alternating rounds so
    that machine load affects both alike,
  * a sandboxed call that does ctx.fetch of a loopback http.server page
    (through brainstem.sandbox.fetch.fetch with allow=["127.0.0.1"]),
    isolation on,
  * the same trivial function called in-process (baseline),
and the ratio.  Target: trivial sandboxed call, isolation on, <= 5 ms median.
Exits non-zero on a miss.

    python bench/tool_call.py [RUNS]
"""

from __future__ import annotations

import http.server
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brainstem.sandbox import Limits, report, run, shutdown  # noqa: E402
from brainstem.sandbox.fetch import fetch  # noqa: E402
from brainstem.sandbox.kernel.switch import ENV_SWITCH  # noqa: E402

TARGET_MS = 5.0
ROUNDS = 10

TRIVIAL = "def execute(args, ctx):\n    return {'n': args['n'] + 1}\n"
FETCHING = ("def execute(args, ctx):\n"
            "    r = ctx.fetch(args['url'])\n"
            "    return {'status': r['status'], 'len': len(r['text'])}\n")


class _Page(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802
        body = b"<html><body>hello from loopback</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Services:
    secrets: dict = {}
    kv_access = "none"

    def kv_get(self, key):
        return None

    def kv_put(self, key, value):
        pass

    def kv_list(self, prefix):
        return []

    def kv_delete(self, key):
        return False

    def fetch(self, url, method, headers, json, data, timeout):
        return fetch(url, method, headers, json, data, timeout, allow=["127.0.0.1"])

    def log(self, message):
        pass


def samples_ms(fn, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000.0)
    return samples


def median_ms(fn, runs: int) -> float:
    return statistics.median(samples_ms(fn, runs))


def use_isolation(on: bool) -> None:
    """Restart the fork server with the isolation on or off (it reads the switch at start)."""
    shutdown()
    if on:
        os.environ.pop(ENV_SWITCH, None)
    else:
        os.environ[ENV_SWITCH] = "off"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/page"
    services = Services()
    limits = Limits(timeout_ms=10_000)

    def trivial():
        o = run(TRIVIAL, "execute", [{"n": 1}], services=services, limits=limits)
        assert o.ok and o.value == {"n": 2}, o

    def fetching():
        o = run(FETCHING, "execute", [{"url": url}], services=services, limits=limits)
        assert o.ok and o.value["status"] == 200, o

    ns: dict = {}
    exec(TRIVIAL, ns)  # the same function, unsandboxed

    def baseline():
        assert ns["execute"]({"n": 1}, None) == {"n": 2}

    on: list[float] = []
    off: list[float] = []
    per_round = max(1, runs // ROUNDS)
    for _ in range(ROUNDS):
        for isolated, bucket in ((True, on), (False, off)):
            use_isolation(isolated)
            trivial()  # start the fork server outside the measurement
            bucket.extend(samples_ms(trivial, per_round))
    use_isolation(True)
    trivial()
    fetching()
    active = [name for name, p in report()["protections"].items() if p["state"] == "on"]
    t_trivial = statistics.median(on)
    t_off = statistics.median(off)
    t_fetch = median_ms(fetching, runs)
    t_base = median_ms(baseline, runs)
    print(f"runs per case:              {len(on)}")
    print(f"sandboxed trivial call:     {t_trivial:8.3f} ms median (isolation on)")
    print(f"  same, isolation off:      {t_off:8.3f} ms median ({ENV_SWITCH}=off; "
          f"on costs {t_trivial - t_off:+.3f} ms)")
    print(f"sandboxed ctx.fetch call:   {t_fetch:8.3f} ms median (loopback http.server, isolation on)")
    print(f"in-process baseline call:   {t_base:8.4f} ms median")
    print(f"ratio trivial / baseline:   {t_trivial / t_base:8.0f}x")
    print(f"isolation on:               {', '.join(active)}")
    met = t_trivial <= TARGET_MS
    print(f"target trivial <= {TARGET_MS:g} ms:     {'met' if met else 'MISSED'}")
    server.shutdown()
    shutdown()
    if not met:
        sys.exit(1)


if __name__ == "__main__":
    main()
