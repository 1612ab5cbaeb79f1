"""Whole-process cost of ``brainstem wake`` when it is not yet time to wake.

cron runs ``brainstem wake`` every few minutes; most runs find the agent
asleep. Every documented form of an idle wake is measured: the bare command,
the form the shipped crontab and systemd unit use (``--quiet``),
``--verbose`` and ``--log-format json``. Target: each at most 1.1x the
floor, a ``python -c`` that imports redis and does one GET, measured in the
same run against the same Redis.

Runs are interleaved (each form, then the floor, then again) so machine load
drifts over all alike; the figure is the median wall time of each.
``--busy N`` keeps N processes spinning on the CPU meanwhile (a loaded
machine).

    python bench/wake_noop.py            # starts its own redis-server
    python bench/wake_noop.py --runs 60 --redis-url redis://127.0.0.1:6379/0
    python bench/wake_noop.py --busy 1
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


def start_redis(workdir: str, *extra: str) -> tuple[subprocess.Popen, str]:
    from tests.redis_server import RedisServerError, start_redis_server

    try:
        proc, port = start_redis_server(workdir, None, *extra)
    except RedisServerError as exc:
        sys.exit(f"{exc}; pass --redis-url")
    return proc, f"redis://127.0.0.1:{port}/0"


def wake_command() -> list[str]:
    """The installed console script (what cron runs), else ``python -m brainstem``."""
    script = Path(sys.executable).parent / "brainstem"
    return [str(script), "wake"] if script.exists() else [sys.executable, "-m", "brainstem", "wake"]


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{cmd} failed ({r.returncode}): {r.stderr.decode()[:300]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--redis-url")
    ap.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU during the runs")
    args = ap.parse_args()
    # An installed package has its bytecode compiled (pip does it); an editable checkout under
    # PYTHONDONTWRITEBYTECODE would compile brainstem's modules on every run instead.
    import compileall

    import brainstem

    compileall.compile_dir(str(Path(brainstem.__file__).parent), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = (None, args.redis_url) if args.redis_url else start_redis(tmp)
        spinners: list[subprocess.Popen] = []
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
            bare = wake_command()
            commands = {"brainstem wake": bare, "brainstem wake --quiet": [*bare, "--quiet"],
                        "brainstem wake --verbose": [*bare, "--verbose"],
                        "brainstem wake --log-format json": [*bare, "--log-format", "json"], "floor": floor}
            spinners += [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
            for cmd in commands.values():
                timed(cmd, env)  # warm the page cache
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(args.runs):
                for name, cmd in commands.items():
                    times[name].append(timed(cmd, env))
            r.delete(prefix + "wake_config", prefix + "soul")
        finally:
            for spinner in spinners:
                spinner.kill()
            if proc is not None:
                proc.terminate()
    floor_ms = statistics.median(times.pop("floor")) * 1e3
    busy = f", {args.busy} process(es) spinning" if args.busy else ""
    print(f"floor: python + redis GET        median {floor_ms:7.1f} ms over {args.runs} runs{busy}")
    worst = 0.0
    for name, values in times.items():
        ms = statistics.median(values) * 1e3
        worst = max(worst, ms / floor_ms)
        print(f"{name + ' (asleep)':<42}median {ms:7.1f} ms  ratio {ms / floor_ms:.2f}")
    print(f"worst ratio {worst:.2f}  target <= 1.1  {'ok' if worst <= 1.1 else 'MISSED'}")
    return 0 if worst <= 1.1 else 1


if __name__ == "__main__":
    sys.exit(main())
