"""Does the agent stay the same size? 10,000 sessions against a fast LLM double.

Each simulated session is a real ``wake()`` (orient, two think steps, a
kv_write action, reflect; a deep reflection every 20 sessions), on the
embedded SQLite store, with the clock advanced one hour per session, so karma
retention (30 days = 720 sessions) and the 1,000-entry session history both
come into play. Printed at checkpoints: the orient prompt's size and the
store's size (live payload bytes and file size).

Also timed, as the median over the 50 sessions before a checkpoint: each
session's wall time (the whole ``wake()``), and its end bookkeeping
(``ending.record_end``: the schedule, the session history append with its
trimming and karma retention, the breadcrumbs).

Targets : orient prompt at 10,000 / at 10 <= 1.2; the store grows no
faster than linearly inside the retained window and is flat beyond it; a
session's wall time at 10,000 / at 100 <= 1.2 (the history is a log, so its
bookkeeping does not grow with it).

    python bench/growth.py                 # 10,000 sessions (~10 minutes)
    python bench/growth.py --sessions 1200 # quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import brainstem.session.wake as wake_mod  # noqa: E402
from brainstem.core.settings import load_settings  # noqa: E402
from brainstem.session import ending  # noqa: E402
from brainstem.state.seed import example_soul_path, seed  # noqa: E402
from brainstem.store import open_store  # noqa: E402
from tests.doubles import LLMDouble  # noqa: E402

PLAN = json.dumps({
    "steps": [
        {"id": "look", "type": "think", "prompt": "What matters today?", "model": "haiku", "max_tokens": 64,
         "store_result_as": "focus"},
        {"id": "note", "type": "action", "tool": "kv_write", "input": {"key": "focus", "value": "{{focus}}"}},
        {"id": "act", "type": "think", "prompt": "Act on: {{focus}}", "model": "haiku", "max_tokens": 64},
    ],
    "next_wake_config": {"sleep_seconds": 3600},
})


def answer(request: dict, prompt_sizes: dict, counter: dict) -> str:
    text = request["messages"][-1]["content"]
    if text.startswith("# Orient"):
        counter["orient"] += 1
        prompt_sizes[counter["orient"]] = len(text)
        return PLAN
    if text.startswith("# Deep reflection"):
        return json.dumps({"reflection": "Steady.", "note_to_future_self": "Keep it small.",
                           "updated_wisdom": f"Lesson {counter['orient']}: small steps compound."})
    if text.startswith("# Reflect"):
        return json.dumps({"session_summary": f"Session {counter['orient']} did its three steps.",
                           "note_to_future_self": "Same again tomorrow.",
                           "next_orient_context": {"load_keys": ["wisdom", "tooldata:kv_write:focus"]},
                           "next_wake_config": {"sleep_seconds": 3600}})
    return "Focus on the operator's newest request and keep costs low."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=10_000)
    args = ap.parse_args()
    checkpoints = sorted({c for c in (10, 100, 500, 720, 1000, 2000, 5000, 10_000) if c <= args.sessions}
                         | {args.sessions})
    clock = {"now": datetime(2026, 1, 1, tzinfo=timezone.utc)}
    ending.now_utc = lambda: clock["now"]  # simulated time: one hour per session
    prompt_sizes: dict[int, int] = {}
    counter = {"orient": 0}
    rows = []
    bookkeeping: list[float] = []  # seconds, per session
    wall: list[float] = []
    record_end = ending.record_end

    def timed_record_end(run):
        t = time.perf_counter()
        try:
            return record_end(run)
        finally:
            bookkeeping.append(time.perf_counter() - t)
    ending.record_end = timed_record_end
    with tempfile.TemporaryDirectory() as tmp, LLMDouble() as double:
        double.responder = lambda req: answer(req, prompt_sizes, counter)
        os.environ.update(OPENROUTER_BASE_URL=double.base_url, OPENROUTER_API_KEY="sk-bench-key",
                          BRAINSTEM_MAX_DAILY_COST="1e9", BRAINSTEM_KV=f"sqlite:///{tmp}/agent.db")
        store = open_store()
        seed(store, soul_file=example_soul_path())
        settings = load_settings()
        t0 = time.perf_counter()
        for n in range(1, args.sessions + 1):
            t = time.perf_counter()
            result = wake_mod.wake(settings, store, force=True)
            wall.append(time.perf_counter() - t)
            if result.outcome != "clean":
                sys.exit(f"session {n} ended {result.outcome}")
            clock["now"] += timedelta(hours=1)
            if n in checkpoints:
                usage = store.usage()
                last_orient = prompt_sizes[max(prompt_sizes)] if prompt_sizes else 0
                end_ms = statistics.median(bookkeeping[-50:]) * 1000
                wall_ms = statistics.median(wall[-50:]) * 1000
                rows.append((n, last_orient, usage["bytes"], usage["file_bytes"], usage["logs"], end_ms, wall_ms))
                print(f"{n:>6} sessions  orient prompt {last_orient:>6} chars  store {usage['bytes'] / 1e6:7.2f} MB "
                      f"live ({usage['file_bytes'] / 1e6:6.2f} MB file, {usage['logs']} karma logs)  "
                      f"session {wall_ms:5.1f} ms (end bookkeeping {end_ms:4.1f} ms)  "
                      f"[{time.perf_counter() - t0:6.0f}s]", flush=True)
    first = next(r for r in rows if r[0] >= 10)
    last = rows[-1]
    prompt_ratio = last[1] / first[1]
    print(f"orient prompt at {last[0]} / at {first[0]}: {prompt_ratio:.2f}  (target <= 1.2)")
    ok = prompt_ratio <= 1.2
    plateau = [r for r in rows if r[0] >= 1000]
    if len(plateau) >= 2:
        growth = plateau[-1][2] / plateau[0][2]
        print(f"live store size at {plateau[-1][0]} / at {plateau[0][0]}: {growth:.2f}  "
              "(flat beyond the window: <= 1.1)")
        ok &= growth <= 1.1
    hundredth = next((r for r in rows if r[0] >= 100), None)
    if hundredth is not None and last[0] > hundredth[0]:
        wall_ratio = last[6] / hundredth[6]
        print(f"session wall time at {last[0]} / at {hundredth[0]}: {wall_ratio:.2f}  ({last[6]:.1f} ms / "
              f"{hundredth[6]:.1f} ms; target <= 1.2)")
        print(f"  of which end bookkeeping: {last[5]:.1f} ms / {hundredth[5]:.1f} ms (past the retention window "
              "each session also drops the karma of the one that aged out)")
        ok &= wall_ratio <= 1.2
    print("ok" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
