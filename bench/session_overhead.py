"""Runtime overhead per think step, and whether it grows with session length.

A session of N think steps runs in-process (``brainstem.session.wake.wake``) against a
loopback Redis and an instant OpenAI-compatible double. The baseline is N+2
plain calls of the tier-3 HTTP client to the same double (the session also
makes an orient and a reflect call), measured in the same run. Overhead per
step = (session time - baseline time - fixed) / N: everything the runtime adds
around a model call (chokepoint, budget checks, templates, three karma
appends, the daily-spend update). ``fixed`` is the same difference for a
session whose plan has no steps (ground truth, context, breadcrumbs,
history): paid once per session, so it is reported on its own rather than
smeared over the steps. A warm-up session runs first.

Targets : <= 3 ms per step; the 500-step figure / the 50-step figure <= 1.2.

    python bench/session_overhead.py             # starts its own redis-server
    python bench/session_overhead.py --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from wake_noop import start_redis  # noqa: E402

from brainstem.core.settings import load_settings  # noqa: E402
from brainstem.llm.openrouter import chat  # noqa: E402
from brainstem.session.wake import wake  # noqa: E402
from brainstem.state.seed import example_soul_path, seed  # noqa: E402
from brainstem.store import open_store  # noqa: E402
from tests.doubles import LLMDouble  # noqa: E402

REFLECTION = json.dumps({"session_summary": "ran the benchmark", "note_to_future_self": "none",
                         "next_orient_context": {"load_keys": []}})


def session_seconds(url: str, double: LLMDouble, steps: int) -> float:
    store = open_store(f"{url}?prefix=bench{uuid.uuid4().hex[:8]}:")
    seed(store, soul_file=example_soul_path())
    defaults = json.loads(store.get("config:defaults"))
    defaults["session_budget"] = {"max_cost": 1000, "max_steps": steps, "max_duration_seconds": 3600}
    store.put("config:defaults", defaults)
    plan = {"steps": [{"id": f"s{i}", "type": "think", "prompt": f"Step {i}: say ok.", "model": "haiku",
                       "max_tokens": 16} for i in range(steps)],
            "session_budget": {"max_cost": 1000, "max_steps": steps, "max_duration_seconds": 3600}}
    double.queue(json.dumps(plan), *(["ok"] * steps), REFLECTION)
    settings = load_settings()
    t0 = time.perf_counter()
    result = wake(settings, store, force=True)
    elapsed = time.perf_counter() - t0
    assert result.outcome == "clean" and double.pending == 0, (result, double.pending)
    store.close()
    return elapsed


def baseline_seconds(double: LLMDouble, calls: int) -> float:
    double.responder = lambda req: "ok"
    request = {"model": "anthropic/claude-haiku-4.5", "max_tokens": 16,
               "messages": [{"role": "system", "content": "soul"}, {"role": "user", "content": "Step: say ok."}]}
    t0 = time.perf_counter()
    for _ in range(calls):
        chat(request, base_url=double.base_url, api_key="sk-bench")
    elapsed = time.perf_counter() - t0
    double.responder = None
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis-url")
    ap.add_argument("--repeats", type=int, default=3, help="sessions per size; the median is reported")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LLMDouble() as double:
        proc, url = (None, args.redis_url) if args.redis_url else start_redis(tmp)
        os.environ.update(OPENROUTER_BASE_URL=double.base_url, OPENROUTER_API_KEY="sk-bench-key",
                          BRAINSTEM_MAX_SESSION_COST="1000", BRAINSTEM_MAX_DAILY_COST="100000",
                          BRAINSTEM_MAX_SESSION_STEPS="10000", BRAINSTEM_MAX_SESSION_SECONDS="3600")
        try:
            session_seconds(url, double, 5)  # warm-up: imports, connections, page cache

            def extra(n: int) -> float:
                return statistics.median(session_seconds(url, double, n) - baseline_seconds(double, n + 2)
                                         for _ in range(args.repeats))
            fixed = extra(0)
            print(f"fixed per-session overhead (0 steps): {fixed * 1e3:.1f} ms")
            per_step = {}
            for n in (50, 500):
                per_step[n] = (extra(n) - fixed) / n * 1e3
                print(f"{n:4d} think steps: overhead {per_step[n]:.2f} ms/step (median of {args.repeats} sessions)")
        finally:
            if proc is not None:
                proc.terminate()
    growth = per_step[500] / per_step[50]
    ok = per_step[50] <= 3 and per_step[500] <= 3 and growth <= 1.2
    print(f"500-step / 50-step: {growth:.2f}  targets: <= 3 ms/step, ratio <= 1.2  {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
