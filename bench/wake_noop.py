"""Whole-process cost of ``brainstem wake`` when it is not yet time to wake.

cron runs ``brainstem wake`` every few minutes; most runs find the agent
asleep. Target : at most 1.2x the floor, a ``python -c`` that imports
redis and does one GET, measured in the same run against the same Redis.

Runs are interleaved (wake, floor, wake, floor...) so machine load drifts
over both alike; the figure is the median wall time of each.

    python bench/wake_noop.py            # starts its own redis-server
    python bench/wake_noop.py --runs 60 --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def start_redis(workdir: str) -> tuple[subprocess.Popen, str]:
    from tests.redis_server import RedisServerError, start_redis_server

    try:
        proc, port = start_redis_server(workdir)
    except RedisServerError as exc:
        sys.exit(f"{exc}; pass --redis-url")
    return proc, f"redis://127.0.0.1:{port}/0"


def wake_command() -> list[str]:
    """The installed console script (what cron runs), else ``python -m brainstem``."""
    script = Path(sys.executable).parent / "brainstem"
    return [str(script), "wake"] if script.exists() else [sys.executable, "-m", "brainstem", "wake"]


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{cmd} failed ({r.returncode}): {r.stderr.decode()[:300]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--redis-url")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = (None, args.redis_url) if args.redis_url else start_redis(tmp)
        try:
            prefix = f"benchnoop{os.getpid()}:"
            import redis

            r = redis.Redis.from_url(url)
            r.sadd("__agents__", prefix[:-1])  # the registry of agent names sharing the store
            r.set(prefix + "wake_config", '{"next_wake_after": "2099-01-01T00:00:00Z"}')
            r.set(prefix + "soul", "bench")
            env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
            env.update(BRAINSTEM_KV=url, BRAINSTEM_KV_PREFIX=prefix)
            floor = [sys.executable, "-c",
                     f"import redis; redis.Redis.from_url({url!r}).get({prefix + 'wake_config'!r})"]
            wake = wake_command()
            timed(wake, env), timed(floor, env)  # warm the page cache
            w, f = [], []
            for _ in range(args.runs):
                w.append(timed(wake, env))
                f.append(timed(floor, env))
            r.delete(prefix + "wake_config", prefix + "soul")
        finally:
            if proc is not None:
                proc.terminate()
    wm, fm = statistics.median(w) * 1e3, statistics.median(f) * 1e3
    ratio = wm / fm
    print(f"command: {' '.join(Path(wake[0]).name if i == 0 else a for i, a in enumerate(wake))}")
    print(f"brainstem wake (asleep)   median {wm:7.1f} ms over {args.runs} runs")
    print(f"floor: python + redis GET median {fm:7.1f} ms over {args.runs} runs")
    print(f"ratio {ratio:.2f}  target <= 1.2  {'ok' if ratio <= 1.2 else 'MISSED'}")
    return 0 if ratio <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
