"""Benchmark: the cost of a sandboxed tool call.

Prints the median wall time of
  * a trivial sandboxed call,
  * a sandboxed call that does ctx.fetch of a loopback http.server page
    (through brainstem.sandbox.egress.fetch with allow=["127.0.0.1"]),
  * the same trivial function called in-process (baseline),
and the ratio.  Target: trivial sandboxed call <= 15 ms median.

    python bench/tool_call.py [RUNS]
"""

from __future__ import annotations

import http.server
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brainstem.sandbox import Limits, run, shutdown  # noqa: E402
from brainstem.sandbox.egress import fetch  # noqa: E402

TRIVIAL = "def execute(args, ctx):\n    return {'n': args['n'] + 1}\n"
FETCHING = "def execute(args, ctx):\n    r = ctx.fetch(args['url'])\n    return {'status': r['status'], 'len': len(r['text'])}\n"


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


def median_ms(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(samples)


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

    trivial()  # start the fork server outside the measurement
    fetching()
    t_trivial = median_ms(trivial, runs)
    t_fetch = median_ms(fetching, runs)
    t_base = median_ms(baseline, runs)
    print(f"runs per case:              {runs}")
    print(f"sandboxed trivial call:     {t_trivial:8.3f} ms median")
    print(f"sandboxed ctx.fetch call:   {t_fetch:8.3f} ms median (loopback http.server)")
    print(f"in-process baseline call:   {t_base:8.4f} ms median")
    print(f"ratio trivial / baseline:   {t_trivial / t_base:8.0f}x")
    print(f"target trivial <= 15 ms:    {'met' if t_trivial <= 15 else 'MISSED'}")
    server.shutdown()
    shutdown()


if __name__ == "__main__":
    main()
