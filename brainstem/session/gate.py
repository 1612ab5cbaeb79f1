"""The gate deep reflection passes a proposed orient prompt or config through.

The last clean sessions are replayed (:mod:`brainstem.session.replay`) against
the staged change with recorded answers only (where the change alters a
request, the model is assumed to answer as it did), and a change under which a
session that planned before no longer gets a usable plan is refused. A change the
gate could not judge (too little of the session's time left to replay what it
should) is refused too: the gate fails closed. The wake hands
:func:`check_change` to its session; reflection calls it from there.
"""

from __future__ import annotations

from typing import Any

from brainstem.core import outcomes
from brainstem.session.replay import ReplayError, load, rerun
from brainstem.session.replay_report import compare, shorten
from brainstem.state import history as session_history
from brainstem.store.base import Store

GATE_MIN_SECONDS = 5.0  # the gate needs this much of its session's time left to replay a session
OUT_OF_TIME = "not enough time left to replay"


def check_change(settings, store: Store, staged: dict[str, Any], sessions: int, exclude: str | None = None,
                 time_left=None) -> dict:
    """Replay the last ``sessions`` clean sessions against ``staged`` (key -> new value), recorded answers
    only; ``refused`` names why when a session that planned before no longer gets a usable plan.
    ``time_left()`` (seconds) bounds it: with less than :data:`GATE_MIN_SECONDS` left before a replay
    it should make, the change is refused (``out_of_time``), not waved through unjudged."""
    report: dict[str, Any] = {"keys": sorted(staged), "replayed": [], "skipped": 0, "refused": None}
    if time_left is not None and time_left() < GATE_MIN_SECONDS:  # before anything is read: it needs time
        return _out_of_time(report, time_left())
    candidates = [h for h in session_history.read(store) if h.get("outcome") == outcomes.CLEAN
                  and h.get("kind", "session") == "session" and h.get("id") != exclude]
    for h in reversed(candidates):
        if len(report["replayed"]) >= sessions:
            break
        left = time_left() if time_left is not None else None
        if left is not None and left < GATE_MIN_SECONDS:
            return _out_of_time(report, left)
        try:
            recording = load(store, h["id"])
        except ReplayError:
            report["skipped"] += 1
            continue
        replayed = rerun(settings, store, recording, assume=True, staged=staged,
                       max_seconds=None if left is None else left / 2)
        result = compare(replayed)
        row = {"session": recording.id, "same": result["same"], "differs": result["differs"],
               "outcome": replayed.outcome, "answers": replayed.answers}
        planned_before = isinstance(result["plan"]["before"], dict) and "steps" in result["plan"]["before"]
        planned_now = isinstance(result["plan"]["now"], dict) and "steps" in result["plan"]["now"]
        if planned_before and not planned_now:
            row["broke"] = f"no usable plan any more ({shorten(result['plan']['now'], 120)})"
        elif replayed.outcome == outcomes.ERROR:
            row["broke"] = "the session ends in error"
        report["replayed"].append(row)
        if "broke" in row and report["refused"] is None:
            report["refused"] = f"session {recording.id}: {row['broke']}"
    return report


def _out_of_time(report: dict, left: float) -> dict:
    """Refused: a session the gate should have replayed was not, so the change is not judged safe."""
    report["out_of_time"] = True
    report["refused"] = report["refused"] or (f"{OUT_OF_TIME} ({max(0.0, left):.1f}s left of the session; "
                                              f"the gate needs {GATE_MIN_SECONDS:g}s)")
    return report
