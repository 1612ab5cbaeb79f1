"""``brainstem run`` and the agents' schedules: their due runs, beside the agents' sessions.

Every second (in the loop that watches the inboxes for urgent messages) the daemon asks the store's due
index (:mod:`brainstem.store.due`) which of its agents have something due, and starts a pass over each
such agent's due schedules in a job of its own: a session that runs for minutes never delays a schedule,
and a long run never delays a session. One pass per agent at a time in this daemon; across daemons and
hosts each due run happens once (its claim lease). What each run did is in its own karma, and a line in
the daemon's log.

A tick costs one read of the index (across agents: the operator's view of the store, the default
agent's, when the daemon serves several), and a pass reads only the schedules found due. Each agent is
looked at in full (on Redis, a scan of the keyspace) once when the daemon starts, and then every
:data:`RELOOK` seconds, when its look entry in the index comes due: a schedule written around Brainstem
(by a plain Redis client or sqlite3) is found then, and may so start up to :data:`RELOOK` seconds late.
Every schedule written through Brainstem starts on time.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from brainstem.core.errors import BrainstemError
from brainstem.state.sleep import RELOOK, due_now
from brainstem.store import due as index
from brainstem.store import open_store

log = logging.getLogger("brainstem.run")
__all__ = ["RELOOK", "due_agents", "run_pass", "watch"]


class _Watch:
    """What the watch keeps of one runner: its agents by name, those not looked at yet, the index's view."""

    def __init__(self, runner: Any):
        self.by_name = {a.name or "": a for a in runner.agents}
        self.unlooked = list(runner.agents)
        self.index: Any = getattr(runner, "index", None)  # a view of the store given by the runner, else opened here


_WATCHES: weakref.WeakKeyDictionary[Any, _Watch] = weakref.WeakKeyDictionary()


def watch(runner: Any, sched: Any) -> None:
    """Start a pass over the schedules of each agent of ``runner`` (a daemon's Runner) that needs one."""
    w = _WATCHES.get(runner)
    if w is None:
        w = _WATCHES[runner] = _Watch(runner)
    due, w.unlooked = w.unlooked, []  # each agent once at the start: its index may not exist yet
    try:
        due += [w.by_name[name or ""] for name, _ in due_agents(runner, w) if (name or "") in w.by_name]
    except BrainstemError:
        pass  # the tick reports store trouble
    now = time.monotonic()
    for agent in {id(a): a for a in due}.values():
        if runner.stopping.is_set():
            return
        if agent.store is None or agent.scheduling.locked() or now < agent.backoff_until:
            if agent.store is None:
                w.unlooked.append(agent)  # not opened yet: looked at once it is
            continue
        sched.add_job(run_pass, args=[runner, agent], id=f"schedules-{agent.name or 'default'}",
                      replace_existing=True, misfire_grace_time=None, executor="schedules")


def due_agents(runner: Any, w: Any, which: str = index.SCHEDULES) -> list[tuple[str | None, float]]:
    """The agents with an entry due now in the index ``which``: one read, of the agent's own index when the
    daemon serves one agent, else of the index across agents (``w.index``, the operator's view, opened here
    the first time)."""
    t = index.now()
    if len(runner.agents) == 1:
        agent = runner.agents[0]
        first = agent.store.due_first(which) if agent.store is not None else None
        return [(agent.name, first[1])] if first is not None and first[1] <= t else []
    if w.index is None:
        w.index = open_store(runner.settings.kv, prefix="", check=False, register=False)
    return w.index.due_agents(t, which)


def run_pass(runner: Any, agent: Any) -> None:
    """One pass over ``agent``'s due schedules (:func:`brainstem.session.schedule_run.run_due`). Never raises."""
    from brainstem.session.schedule_run import run_due  # noqa: PLC0415 -- `run` only (see the scheduler's imports)

    label = agent.name or "default"
    if runner.stopping.is_set() or agent.store is None or not agent.scheduling.acquire(blocking=False):
        return
    try:
        due = due_now(agent.store)
        if not due:
            return
        listeners = [runner.metrics.listener(label)] if runner.metrics is not None else []
        for result in run_due(runner.settings, agent.store, providers=runner._providers(), listeners=listeners,
                              cancel=agent.cancel, only=due):
            log.info("%s: %s", label, result.message)
    except BrainstemError as exc:  # the store away: the tick reports it, once per outage
        log.debug("%s: schedules not run: %s", label, exc)
    except Exception as exc:  # noqa: BLE001 - a daemon logs and goes on
        log.warning("%s: schedules: unexpected error: %s: %s", label, type(exc).__name__, exc)
    finally:
        agent.scheduling.release()
