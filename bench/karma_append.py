"""Cost of a karma append at the start of a log and at its 10,000th entry.

Target : the 10,000th append costs at most 1.5x the 1st, on Redis and
on SQLite, i.e. appending is O(1) in the log's length.

Each figure is the median of 200 single appends, each a real ``Karma.record``
of a typical ``llm_call`` entry. The two are measured interleaved, so that
machine load drifting during the run hits both alike: a log is filled to 9,999
entries, then 200 times over, the 1st append to a fresh log is timed and then
the next append to the long one (its 10,000th, 10,001st, ...).

    python bench/karma_append.py                      # SQLite in a temp dir + a redis-server it starts
    python bench/karma_append.py --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brainstem.store import open_store  # noqa: E402
from brainstem.store.karma import Karma  # noqa: E402

N = 10_000
SAMPLES = 200
ENTRY = {
    "model": "anthropic/claude-haiku-4.5", "tier": "hardcoded", "input_tokens": 1234, "output_tokens": 321,
    "cost": 0.0028, "duration_ms": 812,
    "request": {"messages": [{"role": "user", "content": "Summarise the page. " * 20}]},
    "response": "A short summary of the page. " * 10,
}


def timed(k: Karma, i: int) -> float:
    t0 = time.perf_counter()
    k.record("llm_call", i=i, **ENTRY)
    return time.perf_counter() - t0


def measure(store) -> tuple[float, float]:
    run = uuid.uuid4().hex[:8]
    long = Karma(store, f"bench-{run}-long")
    for i in range(N - 1):
        long.record("llm_call", i=i, **ENTRY)
    firsts, lasts = [], []
    for j in range(SAMPLES):
        firsts.append(timed(Karma(store, f"bench-{run}-fresh{j}"), 0))
        lasts.append(timed(long, N - 1 + j))
    assert store.log_length(long.key) == N - 1 + SAMPLES
    return statistics.median(firsts) * 1e3, statistics.median(lasts) * 1e3


def start_redis(workdir: str) -> tuple[subprocess.Popen, str]:
    from tests.redis_server import RedisServerError, start_redis_server

    try:
        proc, port = start_redis_server(workdir, None, "--appendonly", "yes", "--appendfsync", "everysec")
    except RedisServerError as exc:
        sys.exit(f"{exc}; pass --redis-url")
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis-url", help="use this Redis instead of starting one")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        url = args.redis_url
        if url is None:
            proc, url = start_redis(tmp)
        try:
            targets = [("sqlite", f"sqlite:///{tmp}/bench.db"), ("redis", f"{url}?prefix=bench{uuid.uuid4().hex[:6]}:")]
            print(f"{'store':<8}{'1st (ms)':>10}{'10,000th (ms)':>15}{'ratio':>8}  target <= 1.5")
            for name, store_url in targets:
                first, last = measure(open_store(store_url))
                ratio = last / first
                ok &= ratio <= 1.5
                print(f"{name:<8}{first:>10.3f}{last:>15.3f}{ratio:>8.2f}  {'ok' if ratio <= 1.5 else 'MISSED'}")
        finally:
            if proc is not None:
                proc.terminate()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
