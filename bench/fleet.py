"""A fleet: 100 agents on one Redis, woken by two competing ``brainstem run`` daemons.

Both daemons are given all 100 agents (``--agent agent000 ... --agent
agent099``), so every agent's job fires in both: only the wake lock keeps
them from running one agent twice. The model is an instant OpenAI-compatible
double in this process, answering each plan with one think step.

The runtime sleeps an agent at least 60 s after a session, so a tick is made
by hand: the bench deletes every agent's ``wake_config`` at once (every agent
is due), then waits until each agent has finished exactly one more session.
After the ticks, per agent, ``session_history`` must hold exactly one session
per tick: fewer is a missed wake, more is a double run (two daemons in one
tick). A tick "fits" when its sessions, from the first start to the last end,
took less than the daemons' interval.

Figures: wakes (sessions) per second while busy, per-agent session counts
(min/max), the fires each agent's ``wake_log`` recorded (ran, slept,
skipped because the other daemon held the lock, missed, error), and how the
sessions split between the two daemons.

    python bench/fleet.py                    # 100 agents, 5 ticks, --every 5s; starts its own redis-server
    python bench/fleet.py --agents 20 --ticks 3 --every 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from brainstem import keys  # noqa: E402
from brainstem.kv import open_store  # noqa: E402
from brainstem.seed import example_soul_path, seed  # noqa: E402
from tests.doubles import LLMDouble  # noqa: E402

PLAN = json.dumps({"steps": [{"id": "a", "type": "think", "prompt": "Say ok.", "model": "haiku", "max_tokens": 16}],
                   "next_wake_config": {"sleep_seconds": 3600}})
REFLECTION = json.dumps({"session_summary": "fleet tick", "note_to_future_self": "none",
                         "next_orient_context": {"load_keys": []}})
FAR_FUTURE = {"next_wake_after": "2099-01-01T00:00:00Z", "set_by": "bench:fleet"}


def model(req: dict) -> str:
    first = (req["messages"][-1]["content"] or "").lstrip().split("\n", 1)[0]
    if first.startswith("# Orient"):
        return PLAN
    if first.startswith(("# Reflect", "# Deep reflection")):
        return REFLECTION
    return "ok"


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def histories(client, names: list[str]) -> list[list[dict]]:
    raw = client.mget([f"{n}:{keys.SESSION_HISTORY}" for n in names])
    return [json.loads(r) if r else [] for r in raw]


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--every", type=float, default=5.0, help="the daemons' interval in seconds (a tick)")
    ap.add_argument("--redis-url")
    args = ap.parse_args()
    names = [f"agent{i:03d}" for i in range(args.agents)]
    every = f"{args.every:g}s"

    import redis

    with tempfile.TemporaryDirectory() as tmp, LLMDouble(responder=model) as double:
        proc, url = (None, args.redis_url) if args.redis_url else start_redis(tmp)
        client = redis.Redis.from_url(url, decode_responses=True)
        daemons: list[subprocess.Popen] = []
        logs: list[Path] = []
        try:
            t0 = time.perf_counter()
            for n in names:
                store = open_store(url, prefix=f"{n}:")
                seed(store, soul_file=example_soul_path())
                store.put(keys.WAKE_CONFIG, FAR_FUTURE)  # asleep until the first tick
                store.close()
            print(f"seeded {len(names)} agents in {time.perf_counter() - t0:.1f}s; "
                  f"two daemons, each with all of them, --every {every}")

            env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
            env.update(BRAINSTEM_KV=url, OPENROUTER_BASE_URL=double.base_url, OPENROUTER_API_KEY="sk-bench",
                       BRAINSTEM_LLM_BACKOFF="0.01")
            agent_args = [a for n in names for a in ("--agent", n)]
            for i in range(2):
                logs.append(Path(tmp) / f"daemon{i}.err")
                with open(logs[-1], "w") as err:
                    daemons.append(subprocess.Popen(
                        [sys.executable, "-m", "brainstem", "run", "--every", every, *agent_args],
                        env=env, stdout=subprocess.DEVNULL, stderr=err))
            # Both are up once every agent has logged a (sleeping) fire from each.
            deadline = time.monotonic() + 60
            while min(client.llen(f"{n}:{keys.WAKE_LOG}") for n in names) < 2:
                if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                    sys.exit("the daemons did not start: " + logs[0].read_text()[-500:] + logs[1].read_text()[-500:])
                time.sleep(0.2)

            ticks = []
            bench_t0 = time.perf_counter()
            for k in range(1, args.ticks + 1):
                pipe = client.pipeline(transaction=True)
                for n in names:
                    pipe.delete(f"{n}:{keys.WAKE_CONFIG}")
                pipe.execute()
                due_at = time.time()
                deadline = time.monotonic() + 2 * args.every + 60
                while True:
                    counts = [len(h) for h in histories(client, names)]
                    if min(counts) >= k and not running(client, names):
                        break
                    if time.monotonic() > deadline:
                        print(f"tick {k}: timed out; {sum(c >= k for c in counts)} of {len(names)} agents woke")
                        break
                    time.sleep(0.1)
                time.sleep(0.3)  # a double run would show up here
                tick = [(n, h[k - 1]) for n, h in zip(names, histories(client, names), strict=True) if len(h) >= k]
                starts, ends = span_times(client, tick)
                busy = max(ends) - min(starts) if tick else float("nan")
                ticks.append({"sessions": len(tick), "busy": busy, "latency": min(starts) - due_at if tick else 0})
                print(f"tick {k}: {len(tick)} sessions; first started {max(0.0, ticks[-1]['latency']):.1f}s after "
                      f"the agents fell due; busy {busy:.1f}s (first start to last end)"
                      f"{'' if busy < args.every else '  LONGER THAN A TICK'}")
            total = time.perf_counter() - bench_t0
        finally:
            for d in daemons:
                if d.poll() is None:
                    d.send_signal(signal.SIGTERM)
            codes = []
            for d in daemons:
                try:
                    codes.append(d.wait(60))
                except subprocess.TimeoutExpired:
                    d.kill()
                    codes.append("killed")

        hist = histories(client, names)
        per_agent = [len(h) for h in hist]
        outcomes = Counter(s.get("outcome") for h in hist for s in h)
        fires: Counter = Counter()
        reasons: Counter = Counter()
        for n in names:
            for raw in client.lrange(f"{n}:{keys.WAKE_LOG}", 0, -1):
                e = json.loads(raw)
                fires[e.get("fire")] += 1
                if e.get("fire") == "skipped":
                    reasons[e.get("reason")] += 1
        by_daemon = [len(re.findall(r" agent\d{3}: session ", p.read_text())) for p in logs]
        overlaps = 0
        for n, h in zip(names, hist, strict=True):
            spans = sorted(zip(*span_times(client, [(n, s) for s in h]), strict=True))
            overlaps += sum(1 for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False) if s2 < e1)
        if proc is not None:
            proc.terminate()

    sessions = sum(per_agent)
    busy_total = sum(t["busy"] for t in ticks if t["sessions"])
    print()
    print(f"agents {len(names)}, ticks {args.ticks}, interval {every}, daemons 2 (8 worker threads each)")
    print(f"sessions {sessions} in {total:.1f}s of ticks: {sessions / busy_total:.1f} wakes/s while busy "
          f"(median tick busy {statistics.median(t['busy'] for t in ticks):.1f}s, "
          f"max {max(t['busy'] for t in ticks):.1f}s), {sessions / total:.1f} wakes/s overall")
    print(f"sessions per agent: min {min(per_agent)}, max {max(per_agent)} (want exactly {args.ticks}); "
          f"outcomes {dict(outcomes)}")
    print(f"sessions by daemon: {by_daemon[0]} / {by_daemon[1]}; daemon exit codes {codes}")
    print(f"wake_log fires: ran {fires['ran']}, slept {fires['slept']}, skipped (locked) {reasons['locked']}, "
          f"missed {fires['missed']}, error {fires['error']}")
    good = (min(per_agent) == max(per_agent) == args.ticks and overlaps == 0 and fires["error"] == 0
            and fires["missed"] == 0 and set(outcomes) == {"clean"} and codes == [0, 0])
    fit = all(t["busy"] < args.every for t in ticks)
    print(f"every agent woke exactly once per tick, never twice at once: {'ok' if good else 'MISSED'}"
          + ("" if fit else "  (some tick's sessions took longer than the interval)"))
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
