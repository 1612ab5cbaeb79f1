"""Benchmark: the cost of a sandboxed tool call, beside its peers, and under concurrency.

1. One call at a time, the peers interleaved in one run (round robin, so that
   load affects all alike), median wall time of a trivial call
   (``return {'n': args['n'] + 1}``):
     * brainstem: a worker from the pool (forked, locked down, waiting),
       every kernel protection on;
     * smolagents' ``LocalPythonExecutor`` (in-process, no isolation), when
       smolagents is installed (it is a test extra);
     * a fresh interpreter (``python -I -S -c``) per call.
   Calls are spaced by the other peers' turns, as an agent's calls are
   spaced by its LLM calls.  Then, on their own: brainstem calls back to back
   (the pool drains and each call waits for a fork), and brainstem with no
   pool (``BRAINSTEM_SANDBOX_POOL=0``: a worker forked for each call).
2. 16 threads offering calls at 500 calls/s in all (an open loop: latency
   counts from when a call was due, not from when a thread got to it), and
   the same 16 threads back to back (capacity): calls/s and p99.
3. Memory of a waiting worker: what it holds of its own (USS: private pages)
   and its proportional share (PSS), read from /proc/PID/smaps_rollup.

Targets: brainstem / smolagents <= 2; 500 calls/s sustained with p99 < 20 ms.
Exits non-zero on a miss.

    python bench/tool_call.py [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brainstem.sandbox import Limits, pool, report, run, server_pid, shutdown  # noqa: E402

RATIO_TARGET = 2.0
RATE_TARGET = 500.0
P99_TARGET_MS = 20.0
THREADS = 16
POOL = 16

TRIVIAL = "def execute(args, ctx):\n    return {'n': args['n'] + 1}\n"


class Services:
    secrets: dict = {}
    kv_access = "none"

    def log(self, message):
        pass


def brainstem_call() -> None:
    o = run(TRIVIAL, "execute", [{"n": 1}], services=Services(), limits=Limits(timeout_ms=10_000))
    assert o.ok and o.value == {"n": 2}, o


def smolagents_peer():
    try:
        from smolagents.local_python_executor import LocalPythonExecutor
    except ImportError:
        return None
    executor = LocalPythonExecutor(additional_authorized_imports=[])
    executor.send_tools({})
    code = TRIVIAL + "execute({'n': 1}, None)"

    def call() -> None:
        assert executor(code).output == {"n": 2}

    return call


def fresh_interpreter_call() -> None:
    out = subprocess.run([sys.executable, "-I", "-S", "-c", TRIVIAL + "print(execute({'n': 1}, None))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "{'n': 2}"


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000.0


def no_pool(n: int) -> float:
    """Median of n calls with no pool, each after a pause (as in the side-by-side run)."""
    pool.configure(0)
    try:
        out = []
        for _ in range(n):
            time.sleep(0.005)
            out.append(timed(brainstem_call))
        return statistics.median(out)
    finally:
        pool.configure(POOL)


def side_by_side(rounds: int) -> dict[str, list[float]]:
    peers = {"brainstem (pool)": brainstem_call, "fresh python -I -S": fresh_interpreter_call}
    smol = smolagents_peer()
    if smol is not None:
        peers["smolagents LocalPythonExecutor"] = smol
    for fn in peers.values():  # warm every peer (the fork server, the pool, imports) outside the figures
        fn()
    time.sleep(0.2)
    samples: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(rounds):
        for name, fn in peers.items():
            samples[name].append(timed(fn))
    return samples


def burst(n: int) -> float:
    """Median of n brainstem calls back to back (the pool drains; then each waits for a fork)."""
    brainstem_call()
    time.sleep(0.2)
    return statistics.median(timed(brainstem_call) for _ in range(n))


def offered(rate: float, seconds: float) -> tuple[float, float, float]:
    """THREADS threads offering ``rate`` calls/s in all; (achieved calls/s, p50, p99) from when each was due."""
    total = int(rate * seconds)
    t0 = time.monotonic() + 0.05
    latencies: list[float] = []
    lock = threading.Lock()

    def loop(i: int) -> None:
        mine = []
        for k in range(i, total, THREADS):
            due = t0 + k / rate
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            brainstem_call()
            mine.append((time.monotonic() - due) * 1000.0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    latencies.sort()
    return len(latencies) / elapsed, latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


def capacity(seconds: float) -> tuple[float, float]:
    """THREADS threads calling back to back: (calls/s, p99)."""
    stop = time.monotonic() + seconds
    latencies: list[float] = []
    lock = threading.Lock()

    def loop() -> None:
        mine = []
        while time.monotonic() < stop:
            mine.append(timed(brainstem_call))
        with lock:
            latencies.extend(mine)

    t0 = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    return len(latencies) / (time.monotonic() - t0), latencies[int(len(latencies) * 0.99)]


def waiting_worker_memory() -> tuple[float, float, int] | None:
    """(USS MB, PSS MB, how many) averaged over the pool's waiting workers."""
    srv = server_pid()
    if srv is None:
        return None
    found = []
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)
            if not fields[0].endswith("(brainstem-idle") or int(fields[1].split()[1]) != srv:
                continue
            rollup = {}
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 2 and parts[1].isdigit():
                        rollup[parts[0].rstrip(":")] = int(parts[1])
            found.append(((rollup["Private_Clean"] + rollup["Private_Dirty"]) / 1024, rollup["Pss"] / 1024))
        except (OSError, KeyError, IndexError, ValueError):
            continue
    if not found:
        return None
    return (statistics.mean(u for u, _ in found), statistics.mean(p for _, p in found), len(found))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    pool.configure(POOL)
    samples = side_by_side(rounds)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    memory = waiting_worker_memory()
    t_burst = burst(rounds)
    t_no_pool = no_pool(rounds)
    rate, p50, p99 = offered(RATE_TARGET, 5.0)
    cap, cap_p99 = capacity(4.0)
    active = [name for name, p in report()["protections"].items() if p["state"] == "on"]
    pool.drain()
    shutdown()

    print(f"one call at a time, peers interleaved, {rounds} rounds (median):")
    for name, ms in medians.items():
        print(f"  {name:34s} {ms:8.3f} ms")
    print("on their own (median):")
    print(f"  brainstem, calls back to back       {t_burst:8.3f} ms (the pool drains; each waits for a fork)")
    print(f"  brainstem, no pool                  {t_no_pool:8.3f} ms (BRAINSTEM_SANDBOX_POOL=0)")
    smol = medians.get("smolagents LocalPythonExecutor")
    ratio = medians["brainstem (pool)"] / smol if smol else None
    if ratio is not None:
        print(f"brainstem (pool) / smolagents:      {ratio:8.2f}x  (target <= {RATIO_TARGET:g}x)")
    else:
        print("smolagents not installed (pip install -e '.[test]'): no ratio")
    print(f"fresh interpreter / brainstem:      {medians['fresh python -I -S'] / medians['brainstem (pool)']:8.1f}x")
    print(f"{THREADS} threads offering {RATE_TARGET:g} calls/s: {rate:6.0f} calls/s, p50 {p50:6.2f} ms, "
          f"p99 {p99:6.2f} ms (target p99 < {P99_TARGET_MS:g} ms)")
    print(f"{THREADS} threads back to back (capacity): {cap:6.0f} calls/s, p99 {cap_p99:6.2f} ms")
    if memory is not None:
        uss, pss, n = memory
        print(f"a waiting worker ({n} seen): {uss:5.2f} MB of its own (USS), {pss:5.2f} MB PSS")
    print(f"isolation on: {', '.join(active)}")
    met_ratio = ratio is not None and ratio <= RATIO_TARGET
    met_rate = rate >= RATE_TARGET * 0.98 and p99 < P99_TARGET_MS
    print(f"target ratio <= {RATIO_TARGET:g}x: {'met' if met_ratio else 'MISSED'}; "
          f"target {RATE_TARGET:g} calls/s with p99 < {P99_TARGET_MS:g} ms: {'met' if met_rate else 'MISSED'}")
    if not (met_ratio and met_rate):
        sys.exit(1)


if __name__ == "__main__":
    main()
