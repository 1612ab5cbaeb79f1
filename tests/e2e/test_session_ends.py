"""Every way a wake ends, through `brainstem wake` against the loopback LLM: one table, one row a way.

Each row says what the session's outcome is, what its one closing line says, and what the agent is
due for next: when it wakes (never every tick) and whether deep reflection is still due (a deep
reflection that did not happen is never marked done; one that did is).
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

from brainstem.core import keys
from brainstem.core.clock import parse_iso
from brainstem.state import inbox
from brainstem.state.budget import today
from brainstem.state.sleep import PESSIMISTIC
from tests.helpers import ok, run_cli
from tests.wake_helpers import (
    DEEP_ANSWER,
    events_of,
    history,
    is_deep,
    is_orient,
    is_reflect,
    last_session,
    plan,
    reflection,
    run_wake,
    think,
    wake_env,
)

DEFAULT_SLEEP = 21600  # the seed's wake.sleep_seconds
FIRST_RETRY = 60  # after an operator fault or an interruption: due again a minute later
PROSE = "I thought about it at length, and here is no JSON."
CEILING, SPENT = "0.006", 0.0057  # today's ceiling, and what other processes have spent of it already
OTHER_HOLDER = "otherhost:4242:theirs"  # a wake elsewhere that takes the lease over mid-session


def deep_due(st, llm) -> None:
    st.put(keys.SESSION_COUNTER, "19")  # the 20th session: deep reflection's first interval


def spent(st, llm) -> None:
    """Today's spend a whisker under the ceiling: no call fits, so each is refused before it goes."""
    st.settle_spend(today(), None, SPENT)


def sigterm(answer: str):
    """A model that, asked for something, has SIGTERM sent to the wake (this process) while it answers."""
    def respond(req: dict):
        os.kill(os.getpid(), signal.SIGTERM)
        return {"content": answer, "delay": 5}
    return respond


def take_the_lease(st):
    """A model whose first think call's answer comes after another host took the wake's lease over."""
    def respond(req: dict):
        if not is_orient(req):
            owner = st.lease_owner(keys.WAKE_LEASE)
            assert owner and st.release_lease(keys.WAKE_LEASE, owner)
            assert st.acquire_lease(keys.WAKE_LEASE, OTHER_HOLDER, 60_000)
        return plan(think("work"), think("more")) if is_orient(req) else "ok"
    return respond


def spend_the_rest_when_asked_to_think(st):
    """A model whose think answer comes as another process spends the rest of today's ceiling."""
    def respond(req: dict):
        if is_orient(req):
            return plan(think("hi"))
        if not is_reflect(req):
            st.settle_spend(today(), None, 1.0)
        return "ok"
    return respond


def urgent(st, llm) -> None:
    inbox.post(st, "Look at this now, please.", urgent=True)


def answer(*queued: str, responder: Callable[[object], Callable] | None = None):
    def setup(st, llm) -> None:
        llm.queue(*queued)
        if responder is not None:
            llm.responder = responder(st)
    return setup


def status_code(code: int):
    return lambda st, llm: setattr(llm, "responder", lambda req: {"status": code, "message": "nope"})


def both(*setups):
    def setup(st, llm) -> None:
        for s in setups:
            s(st, llm)
    return setup


def reflex(st, llm) -> None:
    """A reflex that always holds: it runs one tool and puts the agent back to sleep for 900 s."""
    do = {"tools": [{"tool": "kv_write", "input": {"key": "k", "value": "v"}}], "sleep_seconds": 900}
    st.put(keys.CONFIG_REFLEXES, json.dumps([{"name": "quiet", "when": {"fact": "hour", "gte": 0},
                                              "cooldown_seconds": 0, "do": do}]))


@dataclass
class End:
    setup: Callable
    outcome: str | None  # session_end's; None: the session wrote no end (its lease was lost)
    line: str  # a pattern the closing line matches from its start
    sleep: float | None  # wake_config.sleep_seconds after; None: the advance made as the session began stands
    deep_due: bool = False  # status --json deep_reflection_due_next_wake after
    args: tuple[str, ...] = ("--force",)
    env: dict = field(default_factory=dict)
    code: int = 0
    calls: int | None = None  # LLM requests the double saw, when the row pins them


S = r"session \S+: "
NEXT = r"; next wake \S+Z"
ENDS = {
    "clean": End(answer(plan(think("hi")), "ok", reflection()), "clean",
                 S + r"clean, \$0\.\d{4}, 1 steps" + NEXT + "$", 3600),
    "clean_with_no_ceiling": End(answer(plan(think("hi")), "ok", reflection()), "clean",
                                 S + r"clean, \$0\.\d{4}, 1 steps" + NEXT + "$", 3600,
                                 env={"BRAINSTEM_MAX_DAILY_COST": "inf", "BRAINSTEM_MAX_SESSION_COST": "inf"}),
    "orient_refused_by_the_daily_ceiling": End(spent, "budget_exhausted",
                                               S + r"budget_exhausted, \$0\.0000, 0 steps" + NEXT
                                               + r" \(no plan was asked for: the orient call could cost more than "
                                               r"the \$0\.000\d+ left\)$", DEFAULT_SLEEP,
                                               env={"BRAINSTEM_MAX_DAILY_COST": CEILING}, calls=0),
    "orient_provider_down": End(status_code(503), "llm_unavailable",
                                S + r"llm_unavailable, \$0\.0000, 0 steps" + NEXT + "; operator: the LLM endpoint is "
                                "down", FIRST_RETRY),
    "orient_out_of_credit": End(status_code(402), "llm_no_credit",
                                S + r"llm_no_credit, \$0\.0000, 0 steps" + NEXT + "; operator: the LLM account is out "
                                "of credit", FIRST_RETRY),
    "no_plan": End(answer(PROSE, PROSE), "no_plan", S + r"no_plan, \$0\.\d{4}, 0 steps" + NEXT
                   + r" \(orient gave no usable plan: no JSON object found", DEFAULT_SLEEP, calls=2),
    "plan_on_the_repair": End(answer(PROSE, plan(think("hi")), "ok", reflection()), "clean",
                              S + r"clean, \$0\.\d{4}, 1 steps" + NEXT + "$", 3600, calls=4),
    "budget_exhausted_before_the_first_step": End(
        answer(plan(think("too dear"), budget={"max_cost": 0.000001})), "budget_exhausted",
        S + r"budget_exhausted, \$0\.\d{4}, 0 steps" + NEXT + r" \(cost budget used: \$0\.\d{4} of \$0\.000001\)$",
        3600, calls=1),
    "reflection_unusable": End(answer(plan(think("hi")), "ok", PROSE), "clean",
                               S + r"clean, \$0\.\d{4}, 1 steps" + NEXT + r" \(reflection did not happen: ", 3600),
    "reflection_refused_by_the_daily_ceiling": End(answer(responder=spend_the_rest_when_asked_to_think),
                                                   "budget_exhausted", S + r"budget_exhausted, \$0\.\d{4}, 1 steps"
                                                   + NEXT + r" \(reflection did not happen: reflect call failed: ",
                                                   3600, env={"BRAINSTEM_MAX_DAILY_COST": "1"}, calls=2),
    "interrupted": End(answer(plan(think("slow")), responder=lambda st: sigterm("late")), "interrupted",
                       S + r"interrupted, \$0\.\d{4}, \d steps" + NEXT + r" \(received SIGTERM\)", FIRST_RETRY,
                       code=143),
    "lease_lost": End(answer(responder=take_the_lease), None, S + "stopped, its wake lease was lost", None, code=75),
    "dry_run": End(answer(plan(think("what if")), "ok", reflection()), "clean",
                   r"dry run dry-\S+: clean, \$0\.\d{4}, 1 steps; nothing was written but its karma", None,
                   args=("--dry-run",)),
    "handled_by_reflex": End(reflex, "handled_by_reflex",
                             r"wake \S+: handled_by_reflex, \$0\.0000, 1 steps" + NEXT + "$", 900, calls=0),
    # Deep reflection: done, it is due no more; not done, it stays due for the next wake.
    "deep_reflection": End(both(deep_due, answer(DEEP_ANSWER)), "clean",
                           S + r"clean, \$0\.\d{4}, 0 steps" + NEXT + "$", DEFAULT_SLEEP, calls=1),
    "deep_refused_by_the_daily_ceiling": End(both(deep_due, spent), "budget_exhausted",
                                             S + r"budget_exhausted, \$0\.0000, 0 steps" + NEXT
                                             + r" \(deep reflection did not happen: ", DEFAULT_SLEEP, deep_due=True,
                                             env={"BRAINSTEM_MAX_DAILY_COST": CEILING}, calls=0),
    "deep_provider_down": End(both(deep_due, status_code(503)), "llm_unavailable",
                              S + r"llm_unavailable, \$0\.0000, 0 steps" + NEXT + "; operator: ", FIRST_RETRY,
                              deep_due=True),
    "deep_out_of_credit": End(both(deep_due, status_code(402)), "llm_no_credit",
                              S + r"llm_no_credit, \$0\.0000, 0 steps" + NEXT + "; operator: ", FIRST_RETRY,
                              deep_due=True),
    "deep_unparsable": End(both(deep_due, answer(PROSE)), "no_reflection",
                           S + r"no_reflection, \$0\.\d{4}, 0 steps" + NEXT + r" \(deep reflection did not happen: ",
                           DEFAULT_SLEEP, deep_due=True, calls=1),
    "deep_interrupted": End(both(deep_due, answer(responder=lambda st: sigterm(DEEP_ANSWER))), "interrupted",
                            S + r"interrupted, \$0\.\d{4}, 0 steps" + NEXT + r" \(received SIGTERM\)", FIRST_RETRY,
                            deep_due=True, code=143),
    "deep_deferred_for_an_urgent_message": End(both(deep_due, urgent, answer(plan(think("hi")), "ok", reflection())),
                                               "clean", S + r"clean, \$0\.\d{4}, 1 steps" + NEXT + "$", 3600,
                                               deep_due=True, calls=3),
    "dry_run_of_a_deep_reflection": End(both(deep_due, answer(DEEP_ANSWER)), "clean",
                                        r"dry run dry-\S+: clean, \$0\.\d{4}, 0 steps", None, deep_due=True,
                                        args=("--dry-run",), calls=1),
    "deep_due_and_a_reflex": End(both(deep_due, reflex, answer(DEEP_ANSWER)), "clean",
                                 S + r"clean, \$0\.\d{4}, 1 steps" + NEXT + "$", DEFAULT_SLEEP, calls=1),
}


@pytest.mark.parametrize("name", list(ENDS))
def test_every_way_a_wake_ends(st, real_store_url, llm, name):
    end = ENDS[name]
    end.setup(st, llm)
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1, **end.env)
    wake_config_before = st.get(keys.WAKE_CONFIG)
    r = run_wake(env, "--quiet", *end.args)
    assert r.returncode == end.code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert re.match(end.line, line), line
    if end.calls is not None:
        assert len(llm.requests) == end.calls, [json.dumps(q)[:200] for q in llm.requests]

    sid, entries = last_session(st)
    assert sid in line
    if end.outcome is None:  # no end written: a lease_lost entry for the wake that holds the lease next
        assert entries[-1]["event"] == "lease_lost" and entries[-1]["outcome"] == "clean"
    else:
        finish = entries[-1]
        assert finish["event"] == "session_end" and finish["outcome"] == end.outcome, finish
        listed = [h["outcome"] for h in history(st) if h.get("id") == sid]
        assert listed == ([] if name.startswith(("dry_run", "handled_by")) else [end.outcome])
        if finish.get("reason") and not finish.get("operator_action"):  # a fault's line says what to do
            assert finish["reason"][:60] in line

    wake_config = st.get_json(keys.WAKE_CONFIG)
    if end.args == ("--dry-run",):
        assert st.get(keys.WAKE_CONFIG) == wake_config_before  # a dry run moves nothing
    elif end.sleep is None:
        assert wake_config["set_by"] == PESSIMISTIC and wake_config["session_id"] == sid
        assert _seconds_until(wake_config["next_wake_after"]) > DEFAULT_SLEEP - 60
    else:
        assert wake_config["sleep_seconds"] == end.sleep, wake_config
        assert end.sleep - 60 < _seconds_until(wake_config["next_wake_after"]) <= end.sleep

    if end.outcome is None:
        st.release_lease(keys.WAKE_LEASE, OTHER_HOLDER)
    text = ok(run_cli("status", env=env))
    why = [" ".join(ln.split()[1:]) for ln in text.splitlines() if ln.startswith("why ")]
    listed = [h for h in history(st) if h.get("id") == sid]
    if listed and listed[0].get("reason") and not listed[0].get("operator_action"):  # a fault's says what to do
        assert why and why[0][:40] == listed[0]["reason"][:40], (why, listed)
    else:
        assert not why, why
    if listed and listed[0].get("reason") and not listed[0].get("summary"):  # no summary: `sessions` says why
        (row,) = [ln for ln in ok(run_cli("sessions", env=env)).splitlines() if ln.startswith(sid)]
        assert listed[0]["reason"][:30] in row, row
    report = json.loads(ok(run_cli("status", "--json", env=env)))
    assert report["deep_reflection_due_next_wake"] is end.deep_due, report["deep_reflection"]
    ran_deep = any(is_deep(q) for q in llm.requests) and end.args != ("--dry-run",)
    if end.deep_due or not ran_deep:  # not done, so not marked done (a miss is counted)
        assert "last_session" not in (st.get_json(keys.DEEP_REFLECT_SCHEDULE) or {})
    else:
        assert st.get_json(keys.DEEP_REFLECT_SCHEDULE)["last_session"] == 20


def _seconds_until(text: str) -> float:
    t = parse_iso(text)
    assert t is not None, text
    return (t - datetime.now(timezone.utc)).total_seconds()


def test_a_deep_reflection_refused_by_the_ceiling_runs_at_the_next_wake_with_money(st, real_store_url, llm):
    """The operator's case: blocked by the daily ceiling, then (the ceiling raised) the next wake reflects
    deeply rather than orienting, and only then is deep reflection due no more."""
    deep_due(st, llm)
    spent(st, llm)
    blocked = run_wake(wake_env(real_store_url, llm, BRAINSTEM_MAX_DAILY_COST=CEILING), "--force", "--quiet")
    assert " budget_exhausted, " in ok(blocked) and llm.requests == []
    (end,) = events_of(last_session(st)[1], "session_end")
    assert end["kind"] == "deep_reflect" and end["reason"].startswith("deep reflection did not happen: ")
    llm.queue(DEEP_ANSWER)
    again = ok(run_wake(wake_env(real_store_url, llm, BRAINSTEM_MAX_DAILY_COST="1"), "--force", "--quiet"))
    assert " clean, " in again and [is_deep(q) for q in llm.requests] == [True]
    assert st.get_json(keys.DEEP_REFLECT_SCHEDULE)["last_session"] == 21
    assert [h["outcome"] for h in history(st)] == ["budget_exhausted", "clean"]


def test_no_reflection_three_times_in_a_row_restores_the_last_clean_versions(st, env, llm):
    """An unusable deep reflection is the agent's own failure (its prompt, its model), so it counts
    towards auto-restore as no_plan does, rather than leaving the agent stuck in deep reflection. Its
    second miss in a row waits two sessions, so the third wake orients (here: prose, no_plan)."""
    llm.queue(plan(think("hi")), "ok", reflection())
    ok(run_wake(env, "--force", "--quiet"))  # a clean session: what auto-restore goes back to
    orient = st.get(keys.PROMPT_ORIENT)
    st.put(keys.PROMPT_ORIENT, orient + "\nA change of the agent's that broke it.")
    st.put(keys.SESSION_COUNTER, "19")
    for _ in range(2):
        llm.queue(PROSE)
        assert " no_reflection, " in ok(run_wake(env, "--force", "--quiet"))
    llm.queue(PROSE, PROSE)  # orient, and its repair
    assert " no_plan, " in ok(run_wake(env, "--force", "--quiet"))
    llm.queue(DEEP_ANSWER)
    ok(run_wake(env, "--force", "--quiet"))
    _, entries = last_session(st)
    assert events_of(entries, "auto_restore") and st.get(keys.PROMPT_ORIENT) == orient
    assert [h["outcome"] for h in history(st)] == ["clean", "no_reflection", "no_reflection", "no_plan", "clean"]


def test_the_json_wake_result_gives_the_reason(st, env, llm):
    """--log-format json (journald): the closing wake_result line carries the reason beside the outcome."""
    deep_due(st, llm)
    llm.queue(PROSE)
    r = run_wake(env, "--force", "--log-format", "json")
    result = json.loads(ok(r).strip().splitlines()[-1])
    assert result["event"] == "wake_result" and result["outcome"] == "no_reflection"
    assert result["reason"].startswith("deep reflection did not happen: no JSON object")
    assert result["reason"] in result["message"] and result["operator_action"] is None
