"""Scheduled actions at scale: 10,000 agents, 50,000 schedules, one Redis, 4 daemon processes.

Each daemon process serves every agent, through the daemon's own code: each simulated second it calls
:func:`brainstem.daemon.schedules.watch` (one read of the due index across agents), whose passes
(:func:`~brainstem.daemon.schedules.run_pass`) find the agent's due schedules from its own index entries and
run them through the real claim path (:func:`brainstem.session.schedule_run.run_due`: claim lease, run lease,
the run's karma, the settle). Processes rather than the ``brainstem run`` command: 10,000 agents through
``--agent`` would open a store (a Redis connection pool) per agent per process; here each process shares one
client among its 10,000 views, and APScheduler is replaced by a thread pool of 4 (the daemon's "schedules"
executor). The tool does nothing: the run's ``perform`` is replaced by one that notes its start.

Simulated time: the runtime's clock (``now_utc``, read by the index, the look and the runner) runs
``--speed`` times faster than the wall clock, from a common start, and each process ticks every simulated
second. Leases stay in wall time. A lag is measured in simulated seconds (the time of a run's start, as the
runtime's clock reads it, less its scheduled time), so a wall delay counts ``--speed`` times over: what the
bench reports is an upper bound of the lag the same load would see in real time.

Every schedule runs ``every`` 15m, 30m or 1h (operator schedules, ``missed: once``), its first run spread
over its first period. One daemon is SIGKILLed at 40% of the run. Checked from the starts each process wrote
(and the karma of the runs the killed daemon left): every due run started once (duplicates: 0), or, for a
run the killed daemon had claimed, was recorded ``failed`` once by another (losses: 0). Store operations are
Redis's INFO commandstats before and after.

    python bench/schedules_scale.py                       # 10,000 agents, 50,000 schedules, 4 daemons, 20 min
    python bench/schedules_scale.py --agents 1000 --minutes 5 --speed 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

EVERY = {"15m": 900, "30m": 1800, "1h": 3600}
PER_AGENT = 5
RELOOK = 3600.0  # simulated seconds between full looks of one agent; none falls within the run (see RESULTS.md)


class Runner:
    """What the daemon's schedule watch reads of its runner (see brainstem.daemon.scheduler.Runner)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def _providers(self):
        return None


def name(i: int) -> str:
    return f"a{i:05d}"


# --- one daemon process -------------------------------------------------------------------------------------

def daemon(url: str, agents: int, t0: float, speed: float, end: float, out: str) -> None:
    import redis

    import brainstem.core.clock as clock
    import brainstem.session.schedule_run as schedule_run
    import brainstem.state.sleep as sleep
    from brainstem.core.settings import load_settings
    from brainstem.daemon import schedules
    from brainstem.daemon.scheduler import Agent
    from brainstem.session.schedule_action import Done
    from brainstem.store.redis.store import RedisStore

    w0 = [0.0]

    def now_utc() -> datetime:
        return datetime.fromtimestamp(t0 + (time.time() - w0[0]) * speed, timezone.utc)
    for module in (clock, sleep, schedule_run):
        module.now_utc = now_utc  # type: ignore[attr-defined]
    sleep.RELOOK = RELOOK
    starts = open(out, "a", buffering=1)
    lock = threading.Lock()

    def perform(settings, store, karma, schedule, run_id, providers=None):
        at = datetime.strptime(run_id.split("-")[2], "%Y%m%dT%H%M%SZ")  # sched-ID-TIME: the time it was due
        with lock:
            starts.write(f"{store.prefix}{schedule.id} {at.strftime('%Y-%m-%dT%H:%M:%SZ')} {run_id} "
                         f"{now_utc().timestamp():.3f} {os.getpid()}\n")
        return Done("ok")
    schedule_run.perform = perform  # type: ignore[assignment]

    client = redis.Redis.from_url(url, decode_responses=True, max_connections=16)
    settings = load_settings(kv=url, openrouter_api_key="sk-unused", lease_seconds=30)
    views = []
    for i in range(agents):
        view = RedisStore(url, prefix=name(i) + ":", client=client)
        view.registers, view._registered = False, True
        views.append(Agent(name=name(i), prefix=name(i) + ":", store=view))
    index = RedisStore(url, prefix="", client=client)
    runner = Runner(agents=views, stopping=threading.Event(), settings=settings, metrics=None, index=index)
    pool = ThreadPoolExecutor(max_workers=4)
    pending: set[str] = set()

    class Sched:
        def add_job(self, fn, args, id, **_):  # noqa: A002 - APScheduler's own name
            if id in pending:
                return
            pending.add(id)

            def job():
                try:
                    fn(*args)
                finally:
                    pending.discard(id)
            pool.submit(job)
    print("ready", flush=True)
    w0[0] = float(sys.stdin.readline())
    while time.time() < w0[0]:
        time.sleep(0.01)
    tick, ticks = w0[0], 0
    while now_utc().timestamp() < end:
        schedules.watch(runner, Sched())
        ticks += 1
        tick += 1.0 / speed
        time.sleep(max(0.0, tick - time.time()))
    runner.stopping.set()
    pool.shutdown(wait=True)
    print(json.dumps({"ticks": ticks}), flush=True)


# --- the driver ---------------------------------------------------------------------------------------------

def populate(url: str, agents: int, t0: float, seed: int) -> list[tuple[str, str, float, int]]:
    """Register the agents and write their schedules through Brainstem (each write sets its index entry)."""
    import redis

    from brainstem.store.redis.store import RedisStore

    rnd = random.Random(seed)
    client = redis.Redis.from_url(url, decode_responses=True, max_connections=4)
    operator = RedisStore(url, prefix="", client=client)
    made = []
    for i in range(agents):
        operator.register_agent(name(i), adopt=True)  # adopt: no scan for keys of the default agent's
        view = RedisStore(url, prefix=name(i) + ":", client=client)
        view.registers, view._registered = False, True
        for s in range(PER_AGENT):
            every = rnd.choice(list(EVERY))
            first = int(t0) + rnd.randrange(1, EVERY[every])
            view.put(f"schedule:s{s}", {"tool": "noop", "every": every, "created_by": "operator",
                                        "next_run": datetime.fromtimestamp(first, timezone.utc)
                                        .strftime("%Y-%m-%dT%H:%M:%SZ")})
            made.append((name(i), f"s{s}", float(first), EVERY[every]))
        # as if looked at in full just now: the schedules were all written through Brainstem
        view.set_due("schedule:", t0 + RELOOK * rnd.uniform(0.8, 1.0))
    return made


def commandstats(client) -> Counter:
    return Counter({k[len("cmdstat_"):]: v["calls"] for k, v in client.info("commandstats").items()})


def look_cost(url: str) -> tuple[int, int]:
    """(commands, keys in the keyspace) of one full look at one agent: what RELOOK costs each agent."""
    import redis

    from brainstem.state.sleep import full_look
    from brainstem.store.redis.store import RedisStore

    client = redis.Redis.from_url(url, decode_responses=True)
    view = RedisStore(url, prefix=name(0) + ":", client=client)
    view.registers, view._registered = False, True
    before = commandstats(client)
    full_look(view)
    after = commandstats(client)
    return sum((after - before).values()) - 1, client.dbsize()  # less the INFO itself


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else float("nan")


def check(url: str, made, starts: list[list[str]], end: float, killed_pid: int) -> dict:
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    seen = Counter((s[0], s[1]) for s in starts)
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    expected, recorded_failed, lost = 0, 0, []
    margin = 10.0  # a run due in the last simulated seconds may not have started when the daemons stopped
    for agent, sid, first, every in made:
        t = first
        while t <= end - margin:
            expected += 1
            when = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            if (f"{agent}:{sid}", when) not in seen:
                run = f"sched-{sid}-" + datetime.fromtimestamp(t, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                ends = [json.loads(e) for e in client.lrange(f"{agent}:karma:{run}", 0, -1)]
                if any(e.get("event") == "schedule_run" for e in ends):
                    recorded_failed += 1
                else:
                    lost.append(f"{agent}:{sid}@{when}")
            t += every
    return {"expected": expected, "duplicates": duplicates, "recorded_failed": recorded_failed, "lost": lost}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--daemons", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=20.0, help="simulated minutes")
    ap.add_argument("--speed", type=float, default=2.0, help="simulated seconds per wall second")
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--daemon", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.daemon:
        url, agents, t0, speed, end, out = args.daemon
        daemon(url, int(agents), float(t0), float(speed), float(end), out)
        return
    from wake_noop import start_redis

    work = tempfile.mkdtemp(prefix="schedules-scale-")
    proc, url = start_redis(work)
    try:
        run(args, url, work)
    finally:
        proc.terminate()
        proc.wait(10)


def run(args, url: str, work: str) -> None:
    import redis

    t0 = float(int(time.time()) + 10)
    wall = time.time()
    made = populate(url, args.agents, t0, args.seed)
    print(f"populated {args.agents} agents, {len(made)} schedules in {time.time() - wall:.1f}s", flush=True)
    end = t0 + args.minutes * 60
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    outs = [os.path.join(work, f"starts-{i}.txt") for i in range(args.daemons)]
    procs = [subprocess.Popen([sys.executable, __file__, "--daemon", url, str(args.agents), str(t0), str(args.speed),
                               str(end), outs[i]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for i in range(args.daemons)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    client = redis.Redis.from_url(url, decode_responses=True)
    before = commandstats(client)
    w0 = time.time() + 0.5
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{w0}\n")
        p.stdin.flush()
    killed_pid = 0
    if not args.no_kill:
        time.sleep(max(0.0, w0 + 0.4 * args.minutes * 60 / args.speed - time.time()))
        killed_pid = procs[0].pid
        procs[0].send_signal(signal.SIGKILL)
        print(f"killed daemon pid {killed_pid} at simulated minute {0.4 * args.minutes:.0f}", flush=True)
    ticks = 0
    for p in procs:
        out, _ = p.communicate(timeout=args.minutes * 60 / args.speed + 600)
        lines = [x for x in out.splitlines() if x.startswith("{")]
        ticks += json.loads(lines[-1])["ticks"] if lines else 0
    wall_run = time.time() - w0
    after = commandstats(client)
    ops = after - before
    starts = [line.split() for o in outs if os.path.exists(o) for line in open(o) if line.strip()]
    lags = [float(s[3]) - datetime.fromisoformat(s[1].replace("Z", "+00:00")).timestamp() for s in starts]
    result = check(url, made, starts, end, killed_pid)
    look, keyspace = look_cost(url)
    total = sum(ops.values())
    print(f"agents {args.agents}, schedules {len(made)}, daemons {args.daemons}, simulated {args.minutes:.0f} min "
          f"at {args.speed:g}x ({wall_run:.0f} s wall)")
    print(f"runs started {len(starts)} of {result['expected']} due (+{result['recorded_failed']} the killed daemon "
          f"left, recorded failed)")
    print(f"lag from due to start (simulated s): p50 {percentile(lags, 50):.3f}  p99 {percentile(lags, 99):.3f}  "
          f"max {max(lags):.3f}")
    print(f"duplicates {result['duplicates']}  losses {len(result['lost'])}"
          + (f" e.g. {result['lost'][:3]}" if result["lost"] else ""))
    print(f"store commands: {total} over {ticks} ticks of all daemons: {total / max(1, ticks):.1f} per tick, "
          f"{total / max(1, len(starts)):.1f} per run; by command: "
          + ", ".join(f"{k} {v}" for k, v in ops.most_common(8)))
    print(f"one full look at one agent (RELOOK's safety net): {look} commands over a keyspace of {keyspace} keys")


if __name__ == "__main__":
    main()
