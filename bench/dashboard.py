"""Server time of the dashboard's sessions page over a 10,000-session history.

Target : ``GET /sessions`` renders 10,000 sessions, paginated on the server,
in under 200 ms server time: the median of each of ``/sessions``,
``/sessions?page=100`` and ``/sessions?outcome=clean&page=3``.

An SQLite store in a temp dir is seeded, then given a ``session_history`` of
10,000 entries spread over 60 days (appended to the log as the runtime writes
it, but never trimmed: the runtime's own appends keep the last 1,000 to 1,100)
and one session with a 200-entry karma. The app is
``make_app`` as ``brainstem dashboard`` builds it (loopback, a token made at start), with an
LLM key and a stored secret known, so every page passes a real redactor. Each
request goes through Starlette's in-process ``TestClient``; server time is the
time the app takes from receiving the request to sending the last byte of the
response (the guard middleware, the handler, the store reads, the template and
the redaction), measured around the app itself. The figures are the median and
p95 of ``--requests`` requests per URL after ``--warmup`` unmeasured ones, the
URLs taken in turn so that machine load drifts over all of them alike. The
floor is ``/static/app.css``, which reads nothing from the store (every request carries the token as
``Authorization: Bearer``, as a script sends it).

    python bench/dashboard.py
    python bench/dashboard.py --sessions 20000 --requests 50
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET_MS = 200.0
OUTCOMES = [("clean", 85), ("budget_exhausted", 5), ("error", 3), ("no_plan", 3), ("stopped", 2), ("crashed", 1),
            ("llm_unavailable", 1)]
FLOOR = "/static/app.css"
TARGETED = ["/sessions", "/sessions?page=100", "/sessions?outcome=clean&page=3"]


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def history(n: int, days: float, rng: random.Random) -> list[dict]:
    """``n`` session summaries, oldest first, evenly over the last ``days`` days."""
    names, weights = zip(*OUTCOMES, strict=True)
    end = datetime.now(timezone.utc).replace(microsecond=0)
    step = timedelta(days=days) / n
    out = []
    for i in range(n):
        started = end - (n - i) * step
        duration = rng.randint(4_000, 90_000)
        steps = rng.randint(1, 12)
        outcome = rng.choices(names, weights)[0]
        out.append({"id": f"{i + 1}-{rng.getrandbits(24):06x}", "number": i + 1, "kind": "session",
                    "started_at": iso(started), "ended_at": iso(started + timedelta(milliseconds=duration)),
                    "outcome": outcome, "cost": round(rng.uniform(0.002, 0.3), 6), "steps": steps,
                    "steps_failed": 0 if outcome == "clean" else rng.randint(0, 2), "duration_ms": duration,
                    "summary": f"Session {i + 1}: read the inbox, wrote {steps} notes and checked the feed; "
                               f"nothing needed the operator. " * 2})
    return out


def session_karma(store, sid: str, entries: int, rng: random.Random) -> None:
    """A session of ``entries`` karma entries: LLM calls with their messages, tool runs and fetches."""
    from brainstem.store.karma import Karma

    k = Karma(store, sid)
    k.record("session_start", session_id=sid, effort="normal")
    for i in range(entries - 2):
        kind = i % 4
        if kind == 0:
            k.record("llm_call", purpose="think", step_id=f"s{i}", model="anthropic/claude-haiku-4.5",
                     input_tokens=1234, output_tokens=321, cost=0.0028, duration_ms=rng.randint(300, 3000),
                     request={"messages": [{"role": "user", "content": "Summarise the page. " * 40}]},
                     response="A short summary of the page. " * 15)
        elif kind == 1:
            k.record("tool_complete", tool="kv_write", step_id=f"s{i}", duration_ms=rng.randint(3, 40),
                     result={"ok": True, "written": f"notes:{i}"})
        elif kind == 2:
            k.record("fetch", tool="web_fetch", method="GET", scheme="https", host="example.org", port=443,
                     path=f"/feed/{i}", status=200, bytes=20_000, duration_ms=rng.randint(50, 800))
        else:
            k.record("step_complete", step_id=f"s{i}", type="think")
    k.record("session_end", outcome="clean", cost=0.14, steps=entries // 4, duration_ms=60_000)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-len(ordered) * p // 100) - 1))]


class Timed:
    """ASGI wrapper: how long the app took over the last request, receive to last byte sent."""

    def __init__(self, app):
        self.app = app
        self.last = 0.0

    async def __call__(self, scope, receive, send):
        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.last = time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=10_000, help="entries in session_history (default 10,000)")
    ap.add_argument("--days", type=float, default=60, help="days they spread over (default 60)")
    ap.add_argument("--karma", type=int, default=200, help="karma entries of the timeline's session (default 200)")
    ap.add_argument("--requests", type=int, default=30, help="measured requests per URL (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured requests per URL first (default 3)")
    args = ap.parse_args()

    # Secrets the operator's process would know: every page then runs a real redactor.
    os.environ["OPENROUTER_API_KEY"] = "sk-or-v1-bench-0123456789abcdef0123456789abcdef"
    for name in ("BRAINSTEM_DASHBOARD_TOKEN", "BRAINSTEM_TOOL_SECRETS", "BRAINSTEM_ENV_FILE"):
        os.environ.pop(name, None)
    from brainstem.core import keys
    from brainstem.core.settings import load_settings
    from brainstem.operator.dashboard.app import make_app
    from brainstem.operator.dashboard.auth import new_token
    from brainstem.state.seed import seed
    from brainstem.store import open_store

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette 1.x: its TestClient is moving from httpx to httpx2
        from starlette.testclient import TestClient

    rng = random.Random(20261124)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/bench.db")
        seed(store)
        t0 = time.perf_counter()
        entries = history(args.sessions, args.days, rng)
        for e in entries:
            store.append(keys.SESSION_HISTORY, e)
        sid = entries[-1]["id"]
        session_karma(store, sid, args.karma, rng)
        store.put(keys.SESSION_LAST_STARTED, sid)
        store.put(keys.secret("vault"), "vault-bench-value-31415926535")
        size = sum(len(e) for e in store.read_log(keys.SESSION_HISTORY))
        print(f"store: {args.sessions:,} sessions over {args.days:g} days in session_history "
              f"({size / 1e6:.1f} MB of JSON), a {args.karma}-entry karma; filled in "
              f"{time.perf_counter() - t0:.1f} s")

        token = new_token()
        timed = Timed(make_app(load_settings(), {"": store}, token=token, loopback_only=True))
        client = TestClient(timed, base_url="http://127.0.0.1:8765", headers={"Authorization": f"Bearer {token}"})
        urls = [FLOOR, *TARGETED, "/", f"/sessions/{sid}"]
        server: dict[str, list[float]] = {u: [] for u in urls}
        wall: dict[str, list[float]] = {u: [] for u in urls}
        sizes: dict[str, int] = {}
        for round_ in range(args.warmup + args.requests):
            for url in urls:
                t = time.perf_counter()
                r = client.get(url)
                elapsed = time.perf_counter() - t
                if r.status_code != 200:
                    sys.exit(f"GET {url}: {r.status_code} {r.text[:300]}")
                if round_ >= args.warmup:
                    server[url].append(timed.last * 1e3)
                    wall[url].append(elapsed * 1e3)
                sizes[url] = len(r.content)
        if f"{args.sessions} session(s)" not in client.get("/sessions").text:
            sys.exit("the sessions page does not show the whole history's count")

        floor = statistics.median(server[FLOOR])
        print(f"server time per request, {args.requests} requests each after {args.warmup} warm-up "
              f"(in-process TestClient; round trip in brackets)")
        print(f"{'GET':<38}{'median':>9}{'p95':>9}{'x floor':>9}{'round trip':>12}{'page':>10}")
        ok = True
        for url in urls:
            med, p95 = statistics.median(server[url]), percentile(server[url], 95)
            label = url if not url.startswith("/sessions/") else f"/sessions/{{id}} ({args.karma} karma)"
            mark = ""
            if url in TARGETED:
                ok &= med < TARGET_MS
                mark = "  *"
            print(f"{label:<38}{med:>7.1f}ms{p95:>7.1f}ms{med / floor:>8.1f}x"
                  f"{statistics.median(wall[url]):>10.1f}ms{sizes[url] / 1024:>8.0f}KB{mark}")
        worst = max(statistics.median(server[u]) for u in TARGETED)
        print(f"* worst median {worst:.1f} ms  target < {TARGET_MS:.0f} ms server time  "
              f"{'ok' if ok else 'MISSED'}")
        store.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
