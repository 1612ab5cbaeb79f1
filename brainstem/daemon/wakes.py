"""``brainstem run``'s watch for the wakes its agents need outside their own tick: an urgent message from the
operator, and a session that died (with its host, perhaps) while its schedule holds the session's pessimistic
advance.

Every :data:`~brainstem.daemon.scheduler.URGENT_POLL` seconds the daemon asks the store's wake index
(:mod:`brainstem.store.due`) which of its agents have an entry due: ``stats:inbox_urgent`` is due from the
moment an urgent message is left, ``wake`` when the agent's wake lease would run out (each take and renewal
of the lease moves it on, so a session that runs is never due). Each entry found due is decided from the
real keys, as before the index: the inbox's marks, the schedule, the lease. The agent is woken at once when
they say so, and the entry is then set from what was found: removed (nothing waits), moved to the crash's
retry, or asked again a little later (:func:`recheck`: a session still running, a pickup under way). So a
tick reads the index once (across agents when the daemon serves several, else the agent's own) and only the
agents found due: its cost is in proportion to what is due, not to how many agents the daemon serves.

The safety net is a full look: each agent's urgent mark and schedule read and its entries set from them,
round the daemon's agents, so each is looked at once every :data:`~brainstem.state.sleep.RELOOK` seconds
(and all of them in the daemon's first seconds, :data:`FIRST_PASS` a tick). It finds what the index could
not tell: a mark or lease written around Brainstem, an entry whose write failed after the key's landed, an
agent whose Redis ACL user could write only its own index (a daemon serving several agents reads the index
across agents).
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from typing import Any

from brainstem.core.errors import BrainstemError
from brainstem.daemon import schedules
from brainstem.session.wake import dead_session, urgent_state
from brainstem.state.sleep import RELOOK
from brainstem.store import due as index
from brainstem.store.due import LEASE, URGENT, WAKES

log = logging.getLogger("brainstem.run")
__all__ = ["FIRST_PASS", "URGENT_REFIRE", "recheck", "watch"]

FIRST_PASS = 250  # agents looked at in full each tick until the daemon has looked at every one once
URGENT_REFIRE = 60.0  # a fire for an urgent message that left it waiting (an error, say) is tried again after this


def recheck(runner: Any) -> float:
    """Seconds until an entry the watch could not settle is asked again: half a lease period."""
    return max(0.5, runner.settings.lease_seconds / 2)


class _Watch:
    """What the watch keeps of one runner: its agents by name, where the full looks have got to, the index's
    view across agents."""

    def __init__(self, runner: Any):
        self.by_name = {a.name or "": a for a in runner.agents}
        self.next = 0  # the next agent to look at in full
        self.first = True  # the first pass round the agents: FIRST_PASS a tick
        self.index: Any = getattr(runner, "index", None)


_WATCHES: weakref.WeakKeyDictionary[Any, _Watch] = weakref.WeakKeyDictionary()


def watch(runner: Any, sched: Any) -> None:
    """Wake at once each idle agent of ``runner`` (a daemon's Runner) with an urgent message or a dead
    session; then the tick's share of full looks."""
    if not runner.agents:
        return
    w = _WATCHES.get(runner)
    if w is None:
        w = _WATCHES[runner] = _Watch(runner)
    try:
        found = _due(runner, w)
    except BrainstemError:
        found = []  # the tick reports store trouble
    for agent, entries in found:
        if runner.stopping.is_set():
            return
        _check(runner, agent, entries, sched)
    for agent in _looks(runner, w):
        if runner.stopping.is_set():
            return
        if _idle(agent):
            _check(runner, agent, {URGENT, LEASE}, sched, look=True)


def _idle(agent: Any) -> bool:
    """Not running here, opened, and not backing off: the tick reports store trouble, the watch only looks."""
    return not agent.running and agent.store is not None and time.monotonic() >= agent.backoff_until


def _due(runner: Any, w: _Watch) -> list[tuple[Any, set[str]]]:
    """(agent, its entries due now) for each idle agent the wake index says has one due."""
    t = index.now()
    out = []
    for name, _ in schedules.due_agents(runner, w, WAKES):
        agent = w.by_name.get(name or "")
        if agent is not None and _idle(agent):
            out.append((agent, {k for k, _ in agent.store.due_keys(until=t, index=WAKES)}))
    return out


def _looks(runner: Any, w: _Watch) -> list[Any]:
    """This tick's share of full looks: the next agents round the daemon's, enough that each is looked at
    every RELOOK seconds (FIRST_PASS a tick on the first round)."""
    agents = runner.agents
    if not agents:
        return []
    share = FIRST_PASS if w.first else math.ceil(len(agents) / RELOOK)
    picked = [agents[(w.next + i) % len(agents)] for i in range(min(share, len(agents)))]
    w.next += len(picked)
    if w.next >= len(agents):
        w.next, w.first = w.next % len(agents), False
    return picked


def _check(runner: Any, agent: Any, entries: set[str], sched: Any, look: bool = False) -> None:
    """Decide each due entry of ``agent`` from the real keys, wake it if they say so, and set the entry
    from what was found. ``look``: a full look, which also puts back an entry that is missing."""
    store, label = agent.store, agent.name or "default"
    t = index.now()
    try:
        for key in entries - {URGENT, LEASE}:
            store.set_due(key, None, WAKES)  # no entry of the watch's: not the runtime's to keep
        if URGENT in entries:
            urgent, waiting = urgent_state(store)
            entry = store.due_at(URGENT, WAKES) if look else t  # (a look writes only what it corrects)
            last, at = agent.urgent_fired
            if urgent and not (urgent == last and time.monotonic() - at < URGENT_REFIRE):
                agent.urgent_fired = (urgent, time.monotonic())
                log.info("%s: an urgent message from the operator; waking it now", label)
                _fire(runner, agent, sched, "urgent")
                store.set_due(URGENT, t + URGENT_REFIRE, WAKES)  # shown by then, or tried again then
            elif not waiting and entry is not None:
                store.set_due(URGENT, None, WAKES)
            elif waiting and entry is None:
                store.set_due(URGENT, t, WAKES)  # waits while a session runs: asked each tick until it ends
        if LEASE in entries:
            dead, again = dead_session(store, recheck(runner))
            if dead:
                log.info("%s: its last session died with no lease held; waking it now", label)
                _fire(runner, agent, sched, "pickup")
            if not look or dead or (store.due_at(LEASE, WAKES) is None) != (again is None):
                store.set_due(LEASE, again, WAKES)
    except BrainstemError:
        pass  # the store away: the tick reports it, and the entry stays for the next look


def _fire(runner: Any, agent: Any, sched: Any, why: str) -> None:
    sched.add_job(runner.fire, args=[agent], id=f"{why}-{agent.name or 'default'}", replace_existing=True,
                  misfire_grace_time=None, executor="pickup")
