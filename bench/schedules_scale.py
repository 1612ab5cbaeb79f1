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

Each tick is the daemon's whole watch, as ``brainstem run``'s every second: the schedules' (above) and the
one for urgent messages and dead sessions (:func:`brainstem.daemon.wakes.watch`, from the store's wake index).

Every schedule runs ``every`` 15m, 30m or 1h (operator schedules, ``missed: once``), its first run spread
over its first period. One daemon is SIGKILLed at 40% of the run while it holds runs: from a wall second
before, each run it claims either waits between its claim and its start or blocks in its tool, so its four
workers are each holding one, claimed but not started or mid-run, when it dies. Checked from the starts each
process wrote (and the karma of the runs the killed daemon left): every due run started once (duplicates:
0), or, for a run the killed daemon had claimed, was recorded ``failed`` once by another and not run again
(losses: 0). Store operations are Redis's INFO commandstats before and after.

Last, with the daemons stopped and nothing due, the store commands of one tick of the watch over all the
agents idle (the schedules' watch, the urgent watch and the dead-session sweep), against what the urgent
watch and the sweep read of every agent before the wake index.

    python bench/schedules_scale.py                       # 10,000 agents, 50,000 schedules, 4 daemons, 20 min
    python bench/schedules_scale.py --agents 1000 --minutes 5 --speed 10 --lease 5
"""

from __future__ import annotations

import argparse
import json
import math
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
RELOOK_WAKES = 600.0  # the wake watch's full looks: its own, brainstem.state.sleep.RELOOK (not the bench's)


class Runner:
    """What the daemon's watch reads of its runner (see brainstem.daemon.scheduler.Runner)."""

    def __init__(self, **fields):
        self.fired = 0
        self.__dict__.update(fields)

    def _providers(self):
        return None

    def fire(self, agent) -> None:  # no agent here has a session to wake: counted, should one be asked for
        self.fired += 1


class Sched:
    """APScheduler's add_job, each job run in ``pool`` (None: recorded only), one at a time per id."""

    def __init__(self, pool=None):
        self.pool, self.pending, self.jobs = pool, set(), 0

    def add_job(self, fn, args, id, **_):  # noqa: A002 - APScheduler's own name
        self.jobs += 1
        if self.pool is None or id in self.pending:
            return
        self.pending.add(id)

        def job():
            try:
                fn(*args)
            finally:
                self.pending.discard(id)
        self.pool.submit(job)


def views(url: str, agents: int, client) -> list:
    """The daemon's Agent of each agent, its view sharing ``client``."""
    from brainstem.daemon.scheduler import Agent
    from brainstem.store.redis.store import RedisStore

    out = []
    for i in range(agents):
        view = RedisStore(url, prefix=name(i) + ":", client=client)
        view.registers, view._registered = False, True
        out.append(Agent(name=name(i), prefix=name(i) + ":", store=view))
    return out


def tick(runner, sched) -> None:
    """One tick of the daemon's watch (Runner.watch_inboxes): the schedules', then urgent messages and dead
    sessions."""
    from brainstem.daemon import schedules, wakes

    schedules.watch(runner, sched)
    wakes.watch(runner, sched)


def name(i: int) -> str:
    return f"a{i:05d}"


# --- one daemon process -------------------------------------------------------------------------------------

def daemon(url: str, agents: int, t0: float, speed: float, end: float, out: str, hold_at: float,
           lease: float) -> None:
    import redis

    import brainstem.core.clock as clock
    import brainstem.session.schedule_run as schedule_run
    import brainstem.state.sleep as sleep
    from brainstem.core.settings import load_settings
    from brainstem.session.schedule_action import Done
    from brainstem.store.redis.store import RedisStore

    w0 = [0.0]

    def now_utc() -> datetime:
        return datetime.fromtimestamp(t0 + (time.time() - w0[0]) * speed, timezone.utc)
    for module in (clock, sleep, schedule_run):
        module.now_utc = now_utc  # type: ignore[attr-defined]
    sleep.RELOOK = RELOOK
    starts, held = open(out, "a", buffering=1), open(out + ".held", "a", buffering=1)
    lock = threading.Lock()
    blocked: set[str] = set()  # the runs held mid-run: their tool never returns

    def perform(settings, store, karma, schedule, run_id, providers=None):
        at = datetime.strptime(run_id.split("-")[2], "%Y%m%dT%H%M%SZ")  # sched-ID-TIME: the time it was due
        with lock:
            starts.write(f"{store.prefix}{schedule.id} {at.strftime('%Y-%m-%dT%H:%M:%SZ')} {run_id} "
                         f"{now_utc().timestamp():.3f} {os.getpid()}\n")
        if run_id in blocked:
            time.sleep(3600)  # a slow tool: killed here, mid-run
        return Done("ok")
    schedule_run.perform = perform  # type: ignore[assignment]
    run_claimed = schedule_run._run

    def run(ctx, claim):
        """From ``hold_at`` on, each run claimed here is held: between its claim and its start, or mid-run."""
        if now_utc().timestamp() >= hold_at:
            with lock:
                state = "unstarted" if len(blocked) % 2 == 0 else "mid-run"
                blocked.add(claim.run_id)
                held.write(f"{claim.run_id} {ctx.store.prefix}{claim.schedule.id} {state}\n")
            if state == "unstarted":
                time.sleep(3600)  # claimed, not started: killed here
        return run_claimed(ctx, claim)
    schedule_run._run = run  # type: ignore[assignment]

    client = redis.Redis.from_url(url, decode_responses=True, max_connections=16)
    settings = load_settings(kv=url, openrouter_api_key="sk-unused", lease_seconds=lease)
    index = RedisStore(url, prefix="", client=client)
    runner = Runner(agents=views(url, agents, client), stopping=threading.Event(), settings=settings, metrics=None,
                    index=index)
    pool = ThreadPoolExecutor(max_workers=4)
    sched = Sched(pool)
    print("ready", flush=True)
    w0[0] = float(sys.stdin.readline())
    while time.time() < w0[0]:
        time.sleep(0.01)
    next_tick, ticks = w0[0], 0
    while now_utc().timestamp() < end:
        tick(runner, sched)
        ticks += 1
        next_tick += 1.0 / speed
        time.sleep(max(0.0, next_tick - time.time()))
    runner.stopping.set()
    pool.shutdown(wait=True)
    print(json.dumps({"ticks": ticks, "fired": runner.fired}), flush=True)


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


def idle_tick(url: str, agents: int, ticks: int = 20) -> dict:
    """Store commands of one tick of the daemon's watch over ``agents`` idle agents (after its first pass round
    them), and of what the urgent watch (each second) and the sweep (each half lease period) read of every
    agent before the wake index."""
    import redis

    from brainstem.core.settings import load_settings
    from brainstem.daemon import wakes
    from brainstem.session.wake import dead_session_due, urgent_due
    from brainstem.store.redis.store import RedisStore

    client = redis.Redis.from_url(url, decode_responses=True, max_connections=4)
    runner = Runner(agents=views(url, agents, client), stopping=threading.Event(), metrics=None,
                    settings=load_settings(kv=url, openrouter_api_key="sk-unused"),
                    index=RedisStore(url, prefix="", client=client))
    sched = Sched()
    for _ in range(agents // wakes.FIRST_PASS + 2):
        tick(runner, sched)
    sched.jobs = 0
    before = commandstats(client)
    for _ in range(ticks):
        tick(runner, sched)
    per_tick = sum((commandstats(client) - before).values()) - 1
    before = commandstats(client)
    urgent = sum(1 for a in runner.agents if urgent_due(a.store))
    middle = commandstats(client)
    dead = sum(1 for a in runner.agents if dead_session_due(a.store))
    after = commandstats(client)
    return {"per_tick": per_tick / ticks, "urgent_before": sum((middle - before).values()) - 1,
            "sweep_before": sum((after - middle).values()) - 1, "started": sched.jobs, "due": urgent + dead,
            "looks": math.ceil(agents / RELOOK_WAKES)}


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else float("nan")


def check_held(client, held: list[list[str]], starts: list[list[str]], killed_pid: int) -> dict:
    """Of the runs the killed daemon held when it died: each recorded once, ``failed``, by another daemon,
    and not run again by any."""
    bad, states = [], Counter(h[2] for h in held)
    for run_id, schedule, _state in held:
        ends = [e for e in map(json.loads, client.lrange(f"{schedule.split(':')[0]}:karma:{run_id}", 0, -1))
                if e.get("event") == "schedule_run"]
        again = [s for s in starts if s[0] == schedule and s[2] == run_id and s[4] != str(killed_pid)]
        if [e.get("outcome") for e in ends] != ["failed"] or again:
            bad.append(f"{run_id}: ends {[e.get('outcome') for e in ends]}, run again {len(again)}")
    return {"held": len(held), "unstarted": states["unstarted"], "mid-run": states["mid-run"], "bad": bad}


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
    ap.add_argument("--lease", type=float, default=30.0, help="the lease period, wall seconds (a dead run is "
                    "recorded once its run lease runs out)")
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--daemon", nargs=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.daemon:
        url, agents, t0, speed, end, out, hold_at, lease = args.daemon
        daemon(url, int(agents), float(t0), float(speed), float(end), out, float(hold_at), float(lease))
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
    kill_after = 0.4 * args.minutes * 60 / args.speed  # wall seconds from the start
    hold_at = t0 + (kill_after - 1.0) * args.speed if not args.no_kill else float("inf")  # daemon 0 only
    procs = [subprocess.Popen([sys.executable, __file__, "--daemon", url, str(args.agents), str(t0), str(args.speed),
                               str(end), outs[i], str(hold_at if i == 0 else float("inf")), str(args.lease)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
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
        time.sleep(max(0.0, w0 + kill_after - time.time()))
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
    held = check_held(client, [line.split() for line in open(outs[0] + ".held") if line.strip()]
                      if os.path.exists(outs[0] + ".held") else [], starts, killed_pid)
    look, keyspace = look_cost(url)
    idle = idle_tick(url, args.agents)
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
    print(f"held by the killed daemon when it died: {held['held']} runs ({held['unstarted']} claimed and not "
          f"started, {held['mid-run']} mid-run); each recorded failed once by another daemon and not run again: "
          + ("yes" if not held["bad"] else f"no: {held['bad'][:3]}"))
    print(f"one tick of the watch over {args.agents} idle agents (schedules, urgent messages, dead sessions): "
          f"{idle['per_tick']:.1f} commands, of which {idle['looks']} agents' full looks (the safety net, each "
          f"agent every {RELOOK_WAKES:.0f} s); before the wake index: the urgent watch {idle['urgent_before']} "
          f"commands a tick, the sweep {idle['sweep_before']} every half lease period (found due: {idle['due']} "
          f"then, {idle['started']} jobs started now)")


if __name__ == "__main__":
    main()
