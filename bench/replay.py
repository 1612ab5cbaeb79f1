"""How long replaying a 20-step session takes, against the session itself minus its LLM latency.

One session of 20 steps (4 sandboxed ``web_fetch`` of the LLM double's
``GET /models``, 4 ``kv_write``, 4 ``kv_read``, 8 think steps) runs
in-process (``brainstem.session.wake.wake``) on a fresh embedded SQLite store against
the loopback LLM double, which sleeps ``--llm-delay`` seconds before every
answer (10 calls: orient, 8 thinks, reflect). A warm-up session with the same
plan runs first, so the measured sessions and the replays all find the
imports done and the sandbox's fork server started. From each measured
session's karma (``--sessions``, medians reported): its wall time
(``session_end.duration_ms``) and its LLM latency (the sum of its
``llm_call`` durations); the difference is what the runtime, the store and
the tools took.

The last session is then replayed ``--repeat`` times in-process
(``brainstem.session.replay.load`` + ``rerun`` + ``replay_report.compare``: answers from the
recording, tools in the sandbox against an overlay, fetches answered from
the recording) and once through the command line (``python -m brainstem
replay ID``: interpreter start-up, imports and a cold fork server included).
Every replay must report the same behaviour; the bench fails otherwise.

Target: the in-process replay's median <= 1x the original minus its LLM
latency (a replay costs no more than the session did without its model).
Exits non-zero on a miss.

Printed: the original's wall, LLM latency and wall minus LLM; the replays'
median and min, split into load / run / compare; the ratio replay /
(original - LLM); where the time goes (the sandboxed tool calls, as their
``tool_complete`` entries time them, against everything else).

    python bench/replay.py
    python bench/replay.py --sessions 5 --repeat 10 --llm-delay 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brainstem.core import events  # noqa: E402
from brainstem.core.settings import load_settings  # noqa: E402
from brainstem.sandbox import shutdown  # noqa: E402
from brainstem.session import replay as replay_mod  # noqa: E402
from brainstem.session import replay_report  # noqa: E402
from brainstem.session.wake import wake  # noqa: E402
from brainstem.state.seed import example_soul_path, seed  # noqa: E402
from brainstem.store import (  # noqa: E402
    karma,  # noqa: E402
    open_store,
    sqlite_url,
)
from tests.doubles import LLMDouble  # noqa: E402

STEPS = 20
TARGET = 1.0  # a replay costs no more than the session did without its model
BUDGET = {"max_cost": 1000, "max_steps": STEPS, "max_duration_seconds": 600}


def plan_steps(base_url: str) -> list[dict]:
    """Four rounds of: fetch, think on it, write the answer, read it back, think again."""
    steps: list[dict] = []
    for r in range(STEPS // 5):
        steps += [
            {"id": f"get{r}", "type": "action", "tool": "web_fetch", "input": {"url": f"{base_url}/models"},
             "store_result_as": f"page{r}"},
            {"id": f"ask{r}", "type": "think", "prompt": f"Round {r}: which model is listed in {{{{page{r}}}}}?",
             "model": "haiku", "max_tokens": 32, "store_result_as": f"answer{r}"},
            {"id": f"put{r}", "type": "action", "tool": "kv_write",
             "input": {"key": f"bench:model{r}", "value": f"{{{{answer{r}}}}}"}},
            {"id": f"read{r}", "type": "action", "tool": "kv_read",
             "input": {"key": f"tooldata:kv_write:bench:model{r}"}, "store_result_as": f"back{r}"},
            {"id": f"check{r}", "type": "think", "prompt": f"Round {r}: does {{{{back{r}}}}} say the same?",
             "model": "haiku", "max_tokens": 32},
        ]
    assert len(steps) == STEPS
    return steps


def responder(base_url: str, delay: float):
    plan = json.dumps({"steps": plan_steps(base_url), "session_budget": BUDGET,
                       "next_wake_config": {"sleep_seconds": 3600}})
    reflection = json.dumps({"session_summary": "fetched, noted and checked the model list four times",
                             "note_to_future_self": "nothing new", "next_orient_context": {"load_keys": ["wisdom"]}})

    def answer(request: dict) -> dict:
        text = [m for m in request["messages"] if m.get("role") == "user"][-1]["content"].lstrip()
        if text.startswith("# Orient"):
            content = plan
        elif text.startswith("# Reflect"):
            content = reflection
        elif text.startswith("# Deep reflection"):
            raise RuntimeError("the bench expects no deep reflection")
        else:
            content = "double/model"
        return {"content": content, "delay": delay}
    return answer


def session(settings, store) -> tuple[str, list[dict]]:
    result = wake(settings, store, force=True)
    if result.outcome != "clean":
        sys.exit(f"session ended {result.outcome}: {result.message}")
    entries = karma.read(store, result.session_id)
    done = [e for e in entries if e.get("event") == events.STEP_COMPLETE]
    if len(done) != STEPS:
        failed = [e for e in entries if e.get("event") in ("step_failed", "step_skipped", "budget_exceeded")]
        sys.exit(f"session {result.session_id}: {len(done)} of {STEPS} steps completed: {failed[:3]}")
    return result.session_id, entries


def tool_ms(entries: list[dict]) -> float:
    return sum(float(e.get("duration_ms") or 0) for e in entries if e.get("event") == events.TOOL_COMPLETE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=3,
                    help="original sessions measured (after a warm-up); medians are reported, the last is replayed")
    ap.add_argument("--repeat", type=int, default=5, help="in-process replays; median and min are reported")
    ap.add_argument("--llm-delay", type=float, default=0.1,
                    help="seconds the LLM double sleeps before each answer (default 0.1)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LLMDouble() as double:
        double.responder = responder(double.base_url, args.llm_delay)
        url = sqlite_url(Path(tmp).resolve() / "agent.db")
        os.environ.update(OPENROUTER_BASE_URL=double.base_url, OPENROUTER_API_KEY="sk-bench-key",
                          BRAINSTEM_KV=url, BRAINSTEM_FETCH_ALLOW="127.0.0.1", BRAINSTEM_LLM_BACKOFF="0.01",
                          BRAINSTEM_MAX_SESSION_COST="1000", BRAINSTEM_MAX_DAILY_COST="100000",
                          BRAINSTEM_MAX_SESSION_STEPS=str(max(100, STEPS)))
        store = open_store(url)
        seed(store, soul_file=example_soul_path())
        defaults = json.loads(store.get("config:defaults"))
        defaults["session_budget"] = dict(BUDGET)
        store.put("config:defaults", defaults)
        settings = load_settings()
        try:
            session(settings, store)  # warm-up: imports, the fork server, the page cache
            originals = []  # (wall, LLM, tools) in ms of each measured session
            for _ in range(args.sessions):
                sid, entries = session(settings, store)
                end = next(e for e in reversed(entries) if e.get("event") == events.SESSION_END)
                calls = [e for e in entries if e.get("event") == events.LLM_CALL]
                originals.append((float(end["duration_ms"]), float(sum(e.get("duration_ms") or 0 for e in calls)),
                                  tool_ms(entries)))
            wall_ms, llm_ms, orig_tools = (statistics.median(o[i] for o in originals) for i in range(3))
            rest_ms = statistics.median(o[0] - o[1] for o in originals)
            n_requests = len(double.requests)

            replays: list[float] = []
            replay_tools: list[float] = []
            phases: dict[str, list[float]] = {"load": [], "run": [], "compare": []}
            for i in range(args.repeat):
                t0 = time.perf_counter()
                recording = replay_mod.load(store, sid)
                t1 = time.perf_counter()
                replayed = replay_mod.rerun(settings, store, recording)
                t2 = time.perf_counter()
                report = replay_report.compare(replayed)
                t3 = time.perf_counter()
                replays.append((t3 - t0) * 1000.0)
                for name, a, b in (("load", t0, t1), ("run", t1, t2), ("compare", t2, t3)):
                    phases[name].append((b - a) * 1000.0)
                if not report["same"] or report["answers"]["recorded"] != len(calls):
                    print("\n".join(replay_report.render(report)), file=sys.stderr)
                    sys.exit(f"replay {i + 1}: not the same behaviour ({report['differs']}, "
                             f"answers {report['answers']})")
                replay_tools.append(tool_ms(replayed.entries))
            if len(double.requests) != n_requests:
                sys.exit(f"the replays asked the model {len(double.requests) - n_requests} time(s)")

            env = {k: v for k, v in os.environ.items()}
            t0 = time.perf_counter()
            cli = subprocess.run([sys.executable, "-m", "brainstem", "replay", sid], env=env,
                                 capture_output=True, text=True)
            cli_ms = (time.perf_counter() - t0) * 1000.0
            if cli.returncode != 0 or "result: same behaviour" not in cli.stdout:
                sys.exit(f"brainstem replay {sid} exited {cli.returncode}:\n{cli.stdout}{cli.stderr}")
            if len(double.requests) != n_requests:
                sys.exit("the command-line replay asked the model")
        finally:
            store.close()
            shutdown()

    median, best = statistics.median(replays), min(replays)
    print(f"session {sid}: {STEPS} steps (4 web_fetch, 4 kv_write, 4 kv_read, 8 think), "
          f"{len(calls)} LLM calls, double delay {args.llm_delay * 1000:.0f} ms/call")
    print(f"originals: medians of {args.sessions} in-process sessions after a warm-up one")
    print(f"original wall (session_end.duration_ms):   {wall_ms:8.0f} ms   (tools {orig_tools:.0f} ms)")
    print(f"original LLM latency (sum of llm_call):    {llm_ms:8.0f} ms")
    print(f"original minus LLM:                        {rest_ms:8.0f} ms   "
          f"(each: {' / '.join(f'{o[0] - o[1]:.0f}' for o in originals)})")
    print(f"replay in-process, median of {args.repeat}:          {median:8.0f} ms   "
          f"(tools {statistics.median(replay_tools):.0f} ms)")
    print(f"replay in-process, min:                    {best:8.0f} ms")
    print("  of which (medians): " + ", ".join(f"{name} {statistics.median(v):.1f} ms" for name, v in phases.items()))
    print(f"replay via `python -m brainstem replay`:   {cli_ms:8.0f} ms   (start-up, imports, cold sandbox)")
    print(f"ratio replay median / (original - LLM):    {median / rest_ms:8.2f}")
    print(f"ratio replay min / (original - LLM):       {best / rest_ms:8.2f}")
    print(f"ratio CLI replay / (original - LLM):       {cli_ms / rest_ms:8.2f}")
    print(f"all {args.repeat + 1} replays: same behaviour, 0 model calls")
    ok = median <= TARGET * rest_ms
    print(f"target replay median <= {TARGET:g}x (original - LLM):  {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
