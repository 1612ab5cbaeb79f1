"""A fleet: agents on one Redis, woken by several competing ``brainstem run`` daemons.

Every daemon is given every agent (``--agent agent0000 ... --agent agentNNNN``),
so every agent's job fires in each of them: only the wake lease keeps them
from running one agent twice. The model is an OpenAI-compatible double in
this process, answering each plan with one think step (which takes
``--think-delay`` seconds, so sessions are in flight when a host dies).

``--hosts N`` runs N daemons, each believing it is a different host: its own
``BRAINSTEM_HOSTNAME`` and, where ``unshare --uts`` is allowed, its own UTS
namespace with that host name. With ``--kill``, one of them is SIGKILLed
mid-tick (once a third of the tick's sessions have ended), and the others
must take its agents over: their leases run out within ``--lease`` seconds,
and each daemon's sweep finds them within half a lease more.

The runtime sleeps an agent at least 60 s after a session, so a tick is made
by hand: the bench deletes every agent's ``wake_config`` at once (every agent
is due), then waits until each agent has ended one more session cleanly.

Checked, per agent, from its ``session_history`` and karma:
- exactly one clean session per tick (fewer is a missed wake, more a double run);
- every session the killed host left unfinished is closed as ``crashed``
  exactly once, by one later session of the same agent (its
  ``crash_detected``), and no session is lost (every karma log has its
  history entry) or recorded twice;
- no two sessions of one agent overlapped in time.

Measured: wakes (sessions) per second while busy, and how long the dead
host's agents waited (from the SIGKILL to the start of the session that took
each over) against the bound of two lease periods.

    python bench/fleet.py                                    # 100 agents, 2 daemons, 5 ticks
    python bench/fleet.py --hosts 4 --agents 1000 --ticks 3 --kill
    python bench/fleet.py --agents 20 --ticks 3 --every 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from wake_noop import start_redis  # noqa: E402

from brainstem.core import keys  # noqa: E402
from brainstem.state.seed import example_soul_path, seed  # noqa: E402
from brainstem.store import open_store  # noqa: E402
from tests.doubles import LLMDouble  # noqa: E402

PLAN = json.dumps({"steps": [{"id": "a", "type": "think", "prompt": "Say ok.", "model": "haiku", "max_tokens": 16}],
                   "next_wake_config": {"sleep_seconds": 3600}})
REFLECTION = json.dumps({"session_summary": "fleet tick", "note_to_future_self": "none",
                         "next_orient_context": {"load_keys": []}})
FAR_FUTURE = {"next_wake_after": "2099-01-01T00:00:00Z", "set_by": "bench:fleet"}


def model(think_delay: float):
    def answer(req: dict):
        first = (req["messages"][-1]["content"] or "").lstrip().split("\n", 1)[0]
        if first.startswith("# Orient"):
            return PLAN
        if first.startswith(("# Reflect", "# Deep reflection")):
            return REFLECTION
        return {"content": "ok", "delay": think_delay} if think_delay else "ok"
    return answer


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def histories(client, names: list[str]) -> list[list[dict]]:
    """Each agent's session_history (a log: one JSON entry per session), read in one round trip."""
    pipe = client.pipeline(transaction=False)
    for n in names:
        pipe.lrange(f"{n}:{keys.SESSION_HISTORY}", 0, -1)
    return [[json.loads(e) for e in entries] for entries in pipe.execute()]


def clean(h: list[dict]) -> list[dict]:
    return [s for s in h if s.get("outcome") == "clean"]


def uts_allowed() -> bool:
    """Whether this process may give a child its own UTS namespace (root, or a user namespace)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "sh", "-c", "hostname fleet-probe"], capture_output=True).returncode == 0


def span_times(client, sessions: list[tuple[str, dict]]) -> tuple[list[float], list[float]]:
    """Start and end times (ms resolution) of sessions, from the first and last entries of their karma."""
    pipe = client.pipeline(transaction=False)
    for n, s in sessions:
        pipe.lindex(f"{n}:{keys.karma(s['id'])}", 0)
        pipe.lindex(f"{n}:{keys.karma(s['id'])}", -1)
    raw = pipe.execute()
    return [ts(json.loads(r)["t"]) for r in raw[0::2]], [ts(json.loads(r)["t"]) for r in raw[1::2]]


def running(client, names: list[str]) -> int:
    return sum(1 for r in client.mget([f"{n}:{keys.SESSION_CURRENT}" for n in names]) if r)


def seed_all(url: str, names: list[str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(n: str) -> None:
        store = open_store(url, prefix=f"{n}:")
        seed(store, soul_file=example_soul_path())
        store.put(keys.WAKE_CONFIG, FAR_FUTURE)  # asleep until the first tick
        store.close()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def karma_ids(client, name: str) -> set[str]:
    return {k.split(":", 2)[2] for k in client.scan_iter(match=f"{name}:karma:*", count=1000)}


def takeovers(client, names: list[str], hist: list[list[dict]]) -> dict[str, tuple[str, str, float]]:
    """dead session id -> (agent, id of the session that took it over, that session's start time), from
    the ``crash_detected`` entries in the karma of every session that followed a crash."""
    found: dict[str, tuple[str, str, float]] = {}
    for n, h in zip(names, hist, strict=True):
        crashed = {s["id"] for s in h if s.get("outcome") in ("crashed", "host_lost")}
        if not crashed:
            continue
        for s in h:
            entries = [json.loads(e) for e in client.lrange(f"{n}:{keys.karma(s['id'])}", 0, 5)]
            for e in entries:
                if e.get("event") == "crash_detected" and e.get("dead_session") in crashed:
                    if e["dead_session"] in found:
                        found[e["dead_session"]] = (n, "TWICE", 0.0)
                    else:
                        found[e["dead_session"]] = (n, s["id"], ts(entries[0]["t"]))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=2, help="daemons, each with a host identity of its own")
    ap.add_argument("--kill", action="store_true", help="SIGKILL one daemon mid-tick (the second tick, or the only)")
    ap.add_argument("--lease", type=float, default=5.0, help="BRAINSTEM_LEASE_SECONDS for every daemon")
    ap.add_argument("--think-delay", type=float, default=0.0, help="seconds each think step's answer takes")
    ap.add_argument("--every", type=float, default=5.0, help="the daemons' interval in seconds")
    ap.add_argument("--redis-url")
    args = ap.parse_args()
    if args.kill and args.hosts < 2:
        sys.exit("--kill needs --hosts 2 or more: someone must take the dead host's agents over")
    names = [f"agent{i:04d}" if args.agents > 1000 or args.hosts > 2 else f"agent{i:03d}" for i in range(args.agents)]
    every = f"{args.every:g}s"
    kill_tick = min(2, args.ticks) if args.kill else 0
    # Every daemon holds a Redis connection per agent: raise the open-file limit its children inherit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 8 * args.agents + 1024)) if hard != resource.RLIM_INFINITY else 8 * args.agents + 1024
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    uts = args.hosts > 2 or args.kill
    uts = uts and uts_allowed()

    import redis

    with tempfile.TemporaryDirectory() as tmp, LLMDouble(responder=model(args.think_delay)) as double:
        proc, url = (None, args.redis_url) if args.redis_url else start_redis(tmp, "--maxclients", "20000")
        client = redis.Redis.from_url(url, decode_responses=True)
        daemons: list[subprocess.Popen] = []
        logs: list[Path] = []
        killed_at = None
        try:
            t0 = time.perf_counter()
            seed_all(url, names)
            identity = ("own UTS namespaces and BRAINSTEM_HOSTNAME" if uts else "BRAINSTEM_HOSTNAME (no UTS "
                        "namespaces here)") if args.hosts > 2 or args.kill else "this host"
            print(f"seeded {len(names)} agents in {time.perf_counter() - t0:.1f}s; {args.hosts} daemons, each with "
                  f"all of them, --every {every}, lease {args.lease:g}s, host identity: {identity}", flush=True)

            base = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
            base.update(BRAINSTEM_KV=url, OPENROUTER_BASE_URL=double.base_url, OPENROUTER_API_KEY="sk-bench",
                        BRAINSTEM_LLM_BACKOFF="0.01", BRAINSTEM_LEASE_SECONDS=f"{args.lease:g}")
            agent_args = [a for n in names for a in ("--agent", n)]
            for i in range(args.hosts):
                env = dict(base)
                command = [sys.executable, "-m", "brainstem", "run", "--every", every, *agent_args]
                if args.hosts > 2 or args.kill:
                    env["BRAINSTEM_HOSTNAME"] = f"host-{i}"
                    if uts:
                        command = ["unshare", "--uts", "sh", "-c", f'hostname host-{i} && exec "$@"', "sh", *command]
                logs.append(Path(tmp) / f"daemon{i}.err")
                with open(logs[-1], "w") as err:
                    daemons.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err))
            # All are up once every agent has logged a (sleeping) fire from each.
            deadline = time.monotonic() + 120 + args.agents * 0.1
            while True:
                pipe = client.pipeline(transaction=False)
                for n in names:
                    pipe.llen(f"{n}:{keys.WAKE_LOG}")
                if min(pipe.execute()) >= args.hosts:
                    break
                if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                    sys.exit("the daemons did not start: " + " | ".join(p.read_text()[-300:] for p in logs))
                time.sleep(0.5)

            ticks = []
            bench_t0 = time.perf_counter()
            for k in range(1, args.ticks + 1):
                pipe = client.pipeline(transaction=True)
                for n in names:
                    pipe.delete(f"{n}:{keys.WAKE_CONFIG}")
                pipe.execute()
                due_at = time.time()
                deadline = time.monotonic() + 4 * args.every + 4 * args.lease + args.agents * 0.2
                while True:
                    counts = [len(clean(h)) for h in histories(client, names)]
                    if k == kill_tick and killed_at is None and sum(c >= k for c in counts) >= len(names) // 3:
                        daemons[0].send_signal(signal.SIGKILL)
                        killed_at = time.time()
                        print(f"tick {k}: SIGKILLed daemon 0 (host-0) with {len(names) // 3} of the tick's sessions "
                              f"ended", flush=True)
                    if min(counts) >= k and not running(client, names):
                        break
                    if time.monotonic() > deadline:
                        print(f"tick {k}: timed out; {sum(c >= k for c in counts)} of {len(names)} agents woke")
                        break
                    time.sleep(0.2)
                time.sleep(0.5)  # a double run would show up here
                tick = [(n, clean(h)[k - 1]) for n, h in zip(names, histories(client, names), strict=True)
                        if len(clean(h)) >= k]
                starts, ends = span_times(client, tick)
                busy = max(ends) - min(starts) if tick else float("nan")
                ticks.append({"sessions": len(tick), "busy": busy, "latency": min(starts) - due_at if tick else 0})
                print(f"tick {k}: {len(tick)} sessions; first started {max(0.0, ticks[-1]['latency']):.1f}s after "
                      f"the agents fell due; busy {busy:.1f}s (first start to last end)"
                      f"{'' if busy < args.every else '  LONGER THAN A TICK'}", flush=True)
            total = time.perf_counter() - bench_t0
        finally:
            for d in daemons:
                if d.poll() is None:
                    d.send_signal(signal.SIGTERM)
            codes = []
            for d in daemons:
                try:
                    codes.append(d.wait(120))
                except subprocess.TimeoutExpired:
                    d.kill()
                    codes.append("killed")

        hist = histories(client, names)
        per_agent = [len(clean(h)) for h in hist]
        outcomes = Counter(s.get("outcome") for h in hist for s in h)
        fires: Counter = Counter()
        reasons: Counter = Counter()
        for n in names:
            for raw in client.lrange(f"{n}:{keys.WAKE_LOG}", 0, -1):
                e = json.loads(raw)
                fires[e.get("fire")] += 1
                if e.get("fire") == "skipped":
                    reasons[e.get("reason")] += 1
        by_daemon = [len(re.findall(r" agent\d{3,4}: session ", p.read_text())) for p in logs]
        overlaps = lost = doubled = unfinished = 0
        for n, h in zip(names, hist, strict=True):
            spans = sorted(zip(*span_times(client, [(n, s) for s in h]), strict=True))
            overlaps += sum(1 for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False) if s2 < e1)
            ids = [s["id"] for s in h]
            doubled += len(ids) - len(set(ids))
            lost += len(karma_ids(client, n) - set(ids))
            unfinished += bool(client.exists(f"{n}:{keys.SESSION_CURRENT}"))
        taken = takeovers(client, names, hist)
        if proc is not None:
            proc.terminate()

    sessions = sum(per_agent)
    busy_total = sum(t["busy"] for t in ticks if t["sessions"])
    print()
    print(f"agents {len(names)}, ticks {args.ticks}, interval {every}, daemons {args.hosts} (8 worker threads each)")
    print(f"clean sessions {sessions} in {total:.1f}s of ticks: {sessions / busy_total:.1f} wakes/s while busy "
          f"(median tick busy {statistics.median(t['busy'] for t in ticks):.1f}s, "
          f"max {max(t['busy'] for t in ticks):.1f}s), {sessions / total:.1f} wakes/s overall")
    print(f"clean sessions per agent: min {min(per_agent)}, max {max(per_agent)} (want exactly {args.ticks}); "
          f"outcomes {dict(outcomes)}")
    print(f"sessions by daemon: {' / '.join(map(str, by_daemon))}; daemon exit codes {codes}")
    print(f"wake_log fires: ran {fires['ran']}, slept {fires['slept']}, skipped (locked) {reasons['locked']}, "
          f"skipped (still running) {reasons['still_running']}, lease lost {fires['lease_lost']}, "
          f"missed {fires['missed']}, error {fires['error']}")
    print(f"sessions lost (karma with no history entry) {lost}, recorded twice {doubled}, left unfinished "
          f"{unfinished}, overlapping {overlaps}")
    crashed = outcomes.get("crashed", 0) + outcomes.get("host_lost", 0)  # a killed host: host_lost from the others
    good = (min(per_agent) == max(per_agent) == args.ticks and overlaps == 0 and lost == 0 and doubled == 0
            and unfinished == 0 and fires["error"] == 0 and fires["missed"] == 0
            and set(outcomes) <= {"clean", "crashed", "host_lost"})
    resumed_ok = True
    if args.kill:
        waits = sorted(t - killed_at for _, sid, t in taken.values() if sid != "TWICE")
        twice = sum(1 for _, sid, _ in taken.values() if sid == "TWICE")
        bound = 2 * args.lease
        print(f"killed host: {crashed} sessions left unfinished, each closed as crashed; taken over: {len(waits)} "
              f"(twice: {twice})")
        if waits:
            print(f"the dead host's agents waited {statistics.median(waits):.1f}s median, {max(waits):.1f}s max "
                  f"from the SIGKILL to their takeover: {max(waits) / bound:.2f} of the bound (two lease periods, "
                  f"{bound:g}s)")
        resumed_ok = crashed > 0 and len(waits) == crashed and twice == 0 and max(waits) <= bound
        good = good and codes[0] == -signal.SIGKILL and all(c == 0 for c in codes[1:])
    else:
        good = good and all(c == 0 for c in codes) and crashed == 0
    fit = all(t["busy"] < args.every for t in ticks)
    print(f"every agent woken exactly once per tick, no session lost or doubled: {'ok' if good else 'MISSED'}"
          + ("" if fit else "  (some tick's sessions took longer than the interval)"))
    if args.kill:
        print(f"a dead host's agents resumed within two lease periods: {'ok' if resumed_ok else 'MISSED'}")
    return 0 if good and resumed_ok else 1


if __name__ == "__main__":
    sys.exit(main())
