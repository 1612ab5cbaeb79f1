"""How a session ended: the outcome names, in one place, and whose move each one is.

The names are part of the external contract (karma ``session_end``, ``session_history``,
``brainstem sessions``/``status``, the daemon's ``wake_log``): they never change once released.

``FAILING`` outcomes are the agent's own doing and count towards auto-restore.
``OPERATOR_FAULTS`` are the operator's or the infrastructure's: they never count towards
auto-restore, the next wake is retried on a short, growing backoff, and each says in one line
what the operator must do.
"""

from __future__ import annotations

CLEAN = "clean"                        # the plan ran (steps may have failed), or the deep reflection happened
BUDGET_EXHAUSTED = "budget_exhausted"  # a cost, step or time limit ended the session (or kept it from its work)
STOPPED = "stopped"                    # a step or a mid-session tripwire asked to stop
NO_PLAN = "no_plan"                    # orient gave no usable plan (the agent's prompt or config)
NO_REFLECTION = "no_reflection"        # deep reflection gave no usable answer (the agent's prompt or model)
ERROR = "error"                        # an unexpected error in the session (or every call after orient failed)
CRASHED = "crashed"                    # the process died mid-session; noticed by the next wake
INTERRUPTED = "interrupted"            # SIGTERM/SIGINT (a wake or the daemon stopping): not the agent's fault
LLM_AUTH_FAILED = "llm_auth_failed"    # the LLM endpoint refused the key (401/403, a 400 about the key)
LLM_NO_CREDIT = "llm_no_credit"        # the LLM account is out of credit (402)
LLM_UNAVAILABLE = "llm_unavailable"    # the LLM endpoint is down: 5xx, 429 after retries, network, timeouts
LLM_BAD_RESPONSE = "llm_bad_response"  # the LLM endpoint answered, but not with a chat completion
STORE_UNAVAILABLE = "store_unavailable"  # the store became unreachable (or full, or read-only) mid-session
HOST_LOST = "host_lost"                # its host stopped renewing its lease (died, froze, cut off); taken over
HANDLED_BY_REFLEX = "handled_by_reflex"  # a reflex ran its tools and slept: no plan, no LLM call, no history entry

ALL = (CLEAN, BUDGET_EXHAUSTED, STOPPED, NO_PLAN, ERROR, CRASHED, HOST_LOST, INTERRUPTED,
       LLM_AUTH_FAILED, LLM_NO_CREDIT, LLM_UNAVAILABLE, LLM_BAD_RESPONSE, STORE_UNAVAILABLE, HANDLED_BY_REFLEX,
       NO_REFLECTION)  # released names keep their places; a new one goes at the end

# The agent's own failures: three in a row and auto-restore puts back the last clean versions.
FAILING = (CRASHED, NO_PLAN, NO_REFLECTION, ERROR)

# A provider failure on the hard-coded tier (which the agent cannot edit), by its kind.
PROVIDER_FAULTS = {"auth": LLM_AUTH_FAILED, "no_credit": LLM_NO_CREDIT, "unavailable": LLM_UNAVAILABLE,
                   "bad_response": LLM_BAD_RESPONSE}

# The operator's move (or nobody's: an outage that passes), in one line each.
OPERATOR_ACTION = {
    LLM_AUTH_FAILED: "the LLM endpoint refused the API key (HTTP 401/403, or a 400 about the key): set a valid "
                     "BRAINSTEM_LLM_API_KEY (and check BRAINSTEM_LLM_BASE_URL); the agent retries on its own",
    LLM_NO_CREDIT: "the LLM account is out of credit (HTTP 402): add credit at the provider; "
                   "the agent retries on its own",
    LLM_UNAVAILABLE: "the LLM endpoint is down or unreachable (5xx, 429, network, timeout): nothing to do if "
                     "it is a passing outage; if it persists check BRAINSTEM_LLM_BASE_URL and the network",
    LLM_BAD_RESPONSE: "the LLM endpoint answered with something that is not a chat completion: check that "
                      "BRAINSTEM_LLM_BASE_URL points at an OpenAI-compatible API (…/v1)",
    HOST_LOST: "the session's host stopped renewing its wake lease (it died, froze, or lost the network or the "
               "store) and another host took the agent over: check that host; the agent goes on elsewhere",
    STORE_UNAVAILABLE: "the store became unreachable mid-session: check BRAINSTEM_KV (the Redis server, "
                       "the disk); the agent retries on its own",
}
OPERATOR_FAULTS = tuple(OPERATOR_ACTION)

# Backoff after operator faults: 1, 2, 4, 8 ... minutes, capped at the agent's default sleep.
BACKOFF_FIRST_SECONDS = 60.0


def operator_action(outcome: str | None) -> str | None:
    return OPERATOR_ACTION.get(outcome or "")


def fault_streak(entries: list) -> int:
    """How many sessions in a row, at the end of ``entries`` (session history), ended in an operator fault."""
    n = 0
    for h in reversed(entries):
        if not isinstance(h, dict):
            continue
        if h.get("outcome") not in OPERATOR_FAULTS:
            break
        n += 1
    return n


def fault_backoff(streak: int, default_sleep: float) -> float:
    """Seconds until the next try after the ``streak``-th operator fault in a row (1-based)."""
    return min(float(default_sleep), BACKOFF_FIRST_SECONDS * 2 ** max(0, min(streak - 1, 30)))


def crash_streak(entries: list) -> int:
    """How many sessions in a row, at the end of ``entries`` (session history), died mid-session (crashed,
    or lost with their host: a session that takes its host down each time must back off all the same)."""
    n = 0
    for h in reversed(entries):
        if not isinstance(h, dict):
            continue
        if h.get("outcome") not in (CRASHED, HOST_LOST):
            break
        n += 1
    return n


def crash_backoff(streak: int, default_sleep: float) -> float:
    """Seconds after a session starts before, should it die, its agent is woken again, given the crashes
    in a row before it: at once after none (a host that died took the session with it), then 1, 2, 4
    ... minutes, capped at the default sleep, so a crash loop never spends money every tick."""
    if streak <= 0:
        return 0.0
    return min(float(default_sleep), BACKOFF_FIRST_SECONDS * 2 ** min(streak - 1, 30))
