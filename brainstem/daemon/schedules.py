"""``brainstem run`` and the agents' schedules: their due runs, beside the agents' sessions.

Every second (in the loop that watches the inboxes for urgent messages) the daemon looks whether each
agent's schedules need the runner, and when they do it starts a pass over them in a job of its own: a
session that runs for minutes never delays a schedule, and a long run never delays a session. One pass
per agent at a time in this daemon; across daemons and hosts each due run happens once (its claim
lease). What each run did is in its own karma, and a line in the daemon's log.

Looking costs a list call (on Redis, a scan of the keyspace), so the daemon lists an agent's schedules
(:func:`brainstem.state.sleep.schedules_look`) once every :data:`RELOOK` seconds, after each of its
passes and after each of its sessions (which may have written them), and between looks starts a pass
when the earliest ``next_run`` it saw comes. A schedule the operator writes by hand to run within the
next minute may so start up to :data:`RELOOK` seconds late; every other run starts on time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from brainstem.core.clock import now_utc
from brainstem.core.errors import BrainstemError
from brainstem.state.sleep import schedules_look

log = logging.getLogger("brainstem.run")
RELOOK = 60.0  # seconds between lists of an agent's schedules, when nothing else asks for one


def watch(runner: Any, sched: Any) -> None:
    """Start a pass over the schedules of each agent of ``runner`` (a daemon's Runner) that needs one."""
    for agent in runner.agents:
        if runner.stopping.is_set():
            return
        now = time.monotonic()
        if agent.store is None or agent.scheduling.locked() or now < agent.backoff_until:
            continue
        known = agent.schedules_next is not None and now_utc() >= agent.schedules_next
        if not known and agent.schedules_looked and now - agent.schedules_looked < RELOOK:
            continue
        try:
            due, agent.schedules_next = schedules_look(agent.store)
        except BrainstemError:
            continue  # the tick reports store trouble
        agent.schedules_looked = now
        if due:
            sched.add_job(run_pass, args=[runner, agent], id=f"schedules-{agent.name or 'default'}",
                          replace_existing=True, misfire_grace_time=None, executor="schedules")


def run_pass(runner: Any, agent: Any) -> None:
    """One pass over ``agent``'s due schedules (:func:`brainstem.session.schedule_run.run_due`). Never raises."""
    from brainstem.session.schedule_run import run_due  # noqa: PLC0415 -- `run` only (see the scheduler's imports)

    label = agent.name or "default"
    if runner.stopping.is_set() or agent.store is None or not agent.scheduling.acquire(blocking=False):
        return
    try:
        listeners = [runner.metrics.listener(label)] if runner.metrics is not None else []
        for result in run_due(runner.settings, agent.store, providers=runner._providers(), listeners=listeners,
                              cancel=agent.cancel):
            log.info("%s: %s", label, result.message)
    except BrainstemError as exc:  # the store away: the tick reports it, once per outage
        log.debug("%s: schedules not run: %s", label, exc)
    except Exception as exc:  # noqa: BLE001 - a daemon logs and goes on
        log.warning("%s: schedules: unexpected error: %s: %s", label, type(exc).__name__, exc)
    finally:
        agent.schedules_looked = 0.0  # what the pass did is looked at at once: the next run it set
        agent.scheduling.release()
