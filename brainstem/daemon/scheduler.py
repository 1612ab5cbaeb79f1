"""``brainstem run``: a long-running scheduler that wakes one or more agents.

APScheduler 3.x fires a job per agent on an interval or a cron expression,
coalescing missed fires, never running two instances of one agent's job at
once (and the wake lease keeps two *hosts* apart too), with a misfire grace
time and optional jitter. Every fire is written to the agent's bounded
``wake_log``: ran (with the session's outcome), asleep, skipped (locked by another wake, or
still_running: this daemon's previous fire for the agent has not ended),
missed, or error. A store that goes away is retried with backoff and logged
once per outage, not once per tick. SIGTERM/SIGINT stop the scheduler;
running sessions stop at their next step and are recorded as ``interrupted``
(never left looking like a crash they were not).

Several daemons, on several hosts, may run the same agents against one store:
the wake lease lets one session run per agent at a time. A session that died
with its host (its pessimistic schedule advance stands and no lease is held)
is found when its lease would have run out, and its agent woken at once, so
it is taken over within about a lease period of its last renewal rather than
at its next tick.

Every :data:`URGENT_POLL` seconds the daemon looks at what its agents need
beside their ticks, each from a due index the store keeps, so a look costs in
proportion to what is due, not to how many agents it serves: the agents'
schedules (:mod:`brainstem.daemon.schedules`), run beside their sessions; an
urgent message from the operator (``brainstem tell --urgent``), which wakes its
agent within a couple of seconds, once per message; and the dead sessions
(:mod:`brainstem.daemon.wakes`).

The pool of ready sandbox workers (:mod:`brainstem.sandbox.pool`) is the
process's: the daemon uses it from start to stop, and each session uses it
while it runs, so the sessions of several agents at once share it, one ending
never empties the workers another is about to take, and the workers a session
leaves ready wait for the next one. The daemon gives them back when it stops.

With the Telegram bot token and the operator's chat set, a poller thread
(:mod:`brainstem.daemon.telegram`) runs beside the scheduler, feeding the
first agent's inbox, and stops with it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from brainstem.core import keys, outcomes
from brainstem.core.clock import iso, now_iso, now_utc, parse_duration
from brainstem.core.errors import BrainstemError, ConfigError, LeaseHeld, LeaseLost, StoreUnavailable
from brainstem.core.names import agent_prefix
from brainstem.core.settings import Settings
from brainstem.daemon import schedules
from brainstem.sandbox import pool
from brainstem.state import daemon_health, runway
from brainstem.state import history as session_history
from brainstem.state.budget import daily_spent
from brainstem.store import karma as karma_mod
from brainstem.store import open_store
from brainstem.store.base import Store
from brainstem.store.fenced import FencedStore
from brainstem.store.lease import host_name

# `brainstem wakes` imports this module for read_wake_log alone: what only `brainstem run` needs (the runtime
# a fire wakes, the Telegram poller, a cassette, APScheduler) is imported where it is used.
log = logging.getLogger("brainstem.run")

WAKE_LOG_KEEP = 500
BACKOFF_MAX = 300.0
URGENT_POLL = 1.0  # seconds between looks at the due indexes: schedules, urgent messages, dead sessions
# Session outcomes that mean the daemon cannot do its job until the operator acts: the LLM endpoint refused
# the key, has no credit, is down or answers nonsense, or the store went away mid-session.
FIRE_FAULTS = (*outcomes.PROVIDER_FAULTS.values(), outcomes.STORE_UNAVAILABLE)


def parse_every(text: str) -> float:
    """``30s``, ``5m``, ``1h``, ``2d`` (or plain seconds) -> seconds; at least 1 s."""
    seconds = parse_duration(text, "--every")
    if seconds < 1:
        raise ConfigError(f"--every {text!r} is too short: the smallest interval is 1s")
    return seconds


def make_trigger(every: str | None, cron: str | None, jitter: float | None):
    from apscheduler.triggers.cron import CronTrigger  # noqa: PLC0415 -- `run` only
    from apscheduler.triggers.interval import IntervalTrigger  # noqa: PLC0415 -- `run` only

    if (every is None) == (cron is None):
        raise ConfigError("give exactly one of --every INTERVAL or --cron EXPRESSION")
    j = int(jitter) if jitter else None
    if every is not None:
        return IntervalTrigger(seconds=parse_every(every), jitter=j)
    try:
        trigger = CronTrigger.from_crontab(cron, timezone="UTC")
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--cron {cron!r} is not a valid crontab expression: {exc}") from None
    trigger.jitter = j  # from_crontab() takes no jitter in APScheduler 3.x
    return trigger


@dataclass
class Agent:
    name: str | None  # None: the store's own default agent
    prefix: str | None
    store: Store | None = None
    backoff_until: float = 0.0
    backoff: float = 0.0
    outage: str | None = None
    failing: str | None = None  # the reason fires fail, last logged and recorded (stats:daemon); None: not failing
    cancel: threading.Event = field(default_factory=threading.Event)
    running: bool = False
    busy: threading.Lock = field(default_factory=threading.Lock)  # one fire at a time: tick or watch
    urgent_fired: tuple[int, float] = (0, 0.0)  # the urgent message last fired for, and when (monotonic)
    scheduling: threading.Lock = field(default_factory=threading.Lock)  # one pass over its schedules at a time


def _agent(name: str | None, settings: Settings) -> Agent:
    """``--agent NAME`` (or ``NAME:``) -> its Agent; a bad name is a one-line ConfigError. None: the default."""
    if name is None:
        return Agent(name=None, prefix=settings.prefix or None)
    prefix = agent_prefix(name, "--agent")
    if not prefix:
        raise ConfigError(f"--agent {name!r} is empty: give an agent name, or leave --agent out for the default agent")
    return Agent(name=prefix[:-1], prefix=prefix)


def record_fire(store: Store, entry: dict) -> None:
    try:
        store.append(keys.WAKE_LOG, json.dumps({"t": now_iso(ms=True), **entry}))
        if store.log_length(keys.WAKE_LOG) > WAKE_LOG_KEEP * 1.2:
            store.trim_log(keys.WAKE_LOG, WAKE_LOG_KEEP)
    except StoreUnavailable:
        pass  # the outage is logged by the caller


def read_wake_log(store: Store, limit: int | None = None) -> list[dict]:
    """The daemon's fires, oldest first (the newest ``limit`` of them); an unreadable line is kept as
    ``{"fire": "unreadable", "raw": ...}`` rather than dropped. A fire older daemons recorded as ``slept``
    reads as ``asleep``, the one word for it (the metrics' too)."""
    length = store.log_length(keys.WAKE_LOG)
    start = max(0, length - limit) if limit is not None else 0
    out = []
    for raw in store.read_log(keys.WAKE_LOG, start):
        try:
            entry = json.loads(raw)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and entry.get("fire") == "slept":
            entry["fire"] = "asleep"
        out.append(entry if isinstance(entry, dict) else {"fire": "unreadable", "raw": str(raw)[:200]})
    return out


class Runner:
    def __init__(self, settings: Settings, agents: list[str | None], grace: float = 30.0, metrics=None,
                 cassette: str | os.PathLike[str] | None = None):
        self.settings = settings
        # Every fire's session answers from this cassette (a provider of its own per fire, so each session
        # starts at its first answer); None: the configured providers.
        self.cassette = cassette
        self.grace = grace
        self.metrics = metrics  # a brainstem.operator.metrics.Metrics, or None
        self.agents: list[Agent] = []
        for a in agents:  # `--agent x --agent x` is one agent: two jobs would run overlapping sessions
            agent = _agent(a, settings)
            if any(x.prefix == agent.prefix for x in self.agents):
                log.warning("%s: given more than once; running it once", agent.name or "default")
                continue
            self.agents.append(agent)
        self.stopping = threading.Event()

    def _credit_outlook(self, store: Store) -> tuple[float | None, float | None]:
        """(the LLM credit last seen, the runway it gives), for the metrics: None where unknown."""
        seen = runway.outlook(store, daily_spent(store), offered=self.settings.llm_server == "openrouter")
        return seen["llm_credit"], seen["runway_days"]

    def check_agents(self) -> bool:
        """Refuse to start for an agent that does not exist (no soul under its prefix). A store that cannot
        be reached yet is waited for (a daemon started with its Redis, or before it), with one log line;
        False when a signal stopped the wait."""
        delay, said = 1.0, False
        while True:
            try:
                self._check_agents()
                if said:
                    log.info("the store is reachable; starting")
                return True
            except StoreUnavailable as exc:
                if not said:
                    log.error("the store is unavailable; waiting for it (retrying with backoff): %s", exc)
                    said = True
            if self.stopping.wait(delay):
                return False
            delay = min(30.0, delay * 2)

    def _check_agents(self) -> None:
        for a in self.agents:
            store = open_store(self.settings.kv, prefix=a.prefix, register=False)
            if not (store.get(keys.SOUL) or "").strip():
                label = a.name or "the default agent"
                hint = f"BRAINSTEM_KV_PREFIX={a.prefix} " if a.prefix else ""
                raise ConfigError(f"unknown agent: {label} has no soul in {store.display_url}"
                                  + (f" under prefix {a.prefix!r}" if a.prefix else "")
                                  + f"; seed it first: {hint}brainstem seed --soul FILE")
            a.store = store

    def fire(self, agent: Agent) -> None:
        """One scheduled fire for one agent. Never raises: the scheduler must keep going."""
        from brainstem.session.wake import wake  # noqa: PLC0415 -- `run` only

        label = agent.name or "default"
        if self.stopping.is_set():
            return
        if time.monotonic() < agent.backoff_until:
            return
        if not agent.busy.acquire(blocking=False):  # the watch fired it meanwhile, or the tick did
            return
        agent.running = True
        try:
            if agent.store is None:
                agent.store = open_store(self.settings.kv, prefix=agent.prefix, register=False)
            listeners = [self.metrics.listener(label)] if self.metrics is not None else []
            result = wake(self.settings, agent.store, cancel=agent.cancel, listeners=listeners,
                          providers=self._providers(), schedules=False)  # run beside it: see schedules.watch
            if result.status == "ran":
                entry = {"fire": "ran", "outcome": result.outcome, "session_id": result.session_id}
                log.info("%s: %s", label, result.message)
            elif result.status == "lease_lost":
                entry = {"fire": "lease_lost", "session_id": result.session_id}
                log.warning("%s: %s", label, result.message)
            else:
                entry = {"fire": "asleep", "until": result.next_wake_after}
            self._recovered(agent, label)
            self._record(agent, entry)
            if result.status == "ran":
                self._session_ran(agent, label, result.outcome)
        except LeaseHeld as exc:
            self._recovered(agent, label)
            log.info("%s: skipped: %s", label, exc)
            self._record(agent, {"fire": "skipped", "reason": "locked"})
        except StoreUnavailable as exc:
            self._count(agent, "error")
            agent.backoff = min(BACKOFF_MAX, max(1.0, agent.backoff * 2))
            agent.backoff_until = time.monotonic() + agent.backoff
            if agent.outage is None:  # once per outage, not once per tick
                log.error("%s: store unavailable, retrying with backoff: %s", label, exc)
                agent.outage = str(exc)
            self._failing(agent, label, f"store unavailable: {exc}", logged=True)
        except BrainstemError as exc:
            self._failing(agent, label, str(exc))
            self._record(agent, {"fire": "error", "error": str(exc)})
        except Exception as exc:  # noqa: BLE001 - a daemon logs and goes on
            if self._failing(agent, label, f"unexpected error: {type(exc).__name__}: {exc}", logged=True):
                log.exception("%s: unexpected error: %s", label, exc)
            self._count(agent, "error")
        finally:
            agent.running = False
            agent.busy.release()

    def _failing(self, agent: Agent, label: str, reason: str, logged: bool = False) -> bool:
        """A fire failed for an operator fault: logged (unless the caller does) and recorded in the store for
        ``status`` once per change of reason, not every tick. True when the reason is new."""
        if reason == agent.failing:
            return False
        agent.failing = reason
        if not logged:
            log.error("%s: %s (logged again only when the reason changes)", label, reason)
        try:
            if agent.store is not None:  # None: the store could not even be opened
                daemon_health.note_failing(agent.store, reason)
        except BrainstemError:
            pass  # an unreachable or read-only store cannot hold it; the log line above says it
        return True

    def _session_ran(self, agent: Agent, label: str, outcome: str | None) -> None:
        """A session ran: one that ended in an operator fault (a refused key, no credit, the store) keeps or
        sets the failure; any other outcome clears it, with a line when there was one."""
        if outcome in FIRE_FAULTS:
            self._failing(agent, label, f"{outcome}: {outcomes.operator_action(outcome)}")
            return
        if agent.store is None:  # a session ran, so its store is open: never so
            return
        try:
            cleared = daemon_health.clear(agent.store)
        except BrainstemError:
            return  # still recorded; the next fire clears it
        if agent.failing is not None or cleared is not None:
            log.warning("%s: failing no more: a session ran (%s)%s", label, outcome,
                        f" after failing since {cleared['since']}" if cleared else "")
        agent.failing = None

    def _providers(self) -> list | None:
        if self.cassette is None:
            return None
        from brainstem.llm.cassette import CassetteProvider  # noqa: PLC0415 -- `run` only

        return [CassetteProvider(self.cassette)]

    def watch_inboxes(self, sched) -> None:
        """Start what the due indexes say is due: the passes over the agents' schedules, and a fire for each
        idle agent with an urgent message no session has been shown yet (once per message, tried again
        only after :data:`~brainstem.daemon.wakes.URGENT_REFIRE` seconds if a fire left it waiting) or
        whose last session died (see :mod:`brainstem.daemon.wakes`)."""
        from brainstem.daemon import wakes  # noqa: PLC0415 -- `run` only: it imports the runtime a fire wakes

        schedules.watch(self, sched)
        wakes.watch(self, sched)

    def seen(self, stopped: bool = False) -> None:
        """Tell each agent's store this daemon serves it (the dashboard's "running"); never via the fire's lock."""
        for agent in self.agents:
            own = None
            try:
                if agent.store is None:
                    own = open_store(self.settings.kv, prefix=agent.prefix, register=False)
                daemon_health.note_seen(own or agent.store, host_name(), os.getpid(), stopped=stopped,
                                        every=daemon_health.seen_every(len(self.agents)))
            except BrainstemError:
                pass
            finally:
                if own is not None:
                    own.close()

    def _record(self, agent: Agent, entry: dict) -> None:
        """A fire in the agent's wake_log, and in the metrics."""
        self._count(agent, entry["fire"])
        if agent.store is not None:
            record_fire(agent.store, entry)

    def _count(self, agent: Agent, fire: str) -> None:
        if self.metrics is not None:
            self.metrics.fire(agent.name or "default", fire)

    def _recovered(self, agent: Agent, label: str) -> None:
        if agent.outage is not None:
            log.warning("%s: store is back", label)
        agent.outage, agent.backoff, agent.backoff_until = None, 0.0, 0.0

    def missed(self, agent: Agent, scheduled: str) -> None:
        log.warning("%s: missed a fire scheduled for %s", agent.name or "default", scheduled)
        self._record(agent, {"fire": "missed", "scheduled": scheduled})

    def still_running(self, agent: Agent, scheduled: list[str]) -> None:
        """A tick that found the agent's last fire still running: recorded, not only logged."""
        log.info("%s: skipped a fire: the previous session is still running", agent.name or "default")
        self._record(agent, {"fire": "skipped", "reason": "still_running",
                             "scheduled": scheduled[0] if scheduled else None})

    def run(self, every: str | None, cron: str | None, jitter: float | None = None,
            misfire_grace: float = 60.0, run_now: bool = True) -> int:
        """Fire the agents on schedule until SIGTERM or SIGINT, which is heard from the first moment on
        (while the store is waited for, and while the scheduler starts): never the default, fatal handler."""
        def stop(signum, _frame):
            log.info("received %s; stopping (running sessions get %.0fs to finish)",
                     signal.Signals(signum).name, self.grace)
            self.stopping.set()
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            with pool.use(self.settings.sandbox_pool):  # the process's, from start to stop: see the module's doc
                return self._run(every, cron, jitter, misfire_grace, run_now)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _run(self, every, cron, jitter, misfire_grace, run_now) -> int:
        from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED  # noqa: PLC0415 -- `run` only
        from apscheduler.executors.pool import ThreadPoolExecutor  # noqa: PLC0415 -- `run` only
        from apscheduler.schedulers.background import BackgroundScheduler  # noqa: PLC0415 -- `run` only

        trigger = make_trigger(every, cron, jitter)
        if not self.check_agents():
            log.info("stopped")
            return 0
        from brainstem.daemon import telegram  # noqa: PLC0415 -- `run` only

        poller = telegram.start(self.settings, self.agents[0].prefix, label=self.agents[0].name or "default",
                                agents=len(self.agents))  # None unless the bot token and chat are set
        if self.metrics is not None:
            for agent in self.agents:
                self.metrics.watch_spend(agent.name or "default", lambda a=agent: (daily_spent(a.store),
                                                                                   self.settings.max_daily_cost))
                self.metrics.watch_credit(agent.name or "default", lambda a=agent: self._credit_outlook(a.store))
        sched = BackgroundScheduler(timezone="UTC",
                                    executors={"default": ThreadPoolExecutor(max_workers=min(8, len(self.agents))),
                                               # Their own threads: a takeover never queues behind a busy tick.
                                               "inbox": ThreadPoolExecutor(max_workers=1),
                                               "pickup": ThreadPoolExecutor(max_workers=min(4, len(self.agents))),
                                               "schedules": ThreadPoolExecutor(max_workers=min(4, len(self.agents)))})
        by_id = {}
        for i, agent in enumerate(self.agents):
            job_id = f"wake-{agent.name or 'default'}-{i}"
            by_id[job_id] = agent
            sched.add_job(self.fire, trigger, args=[agent], id=job_id, coalesce=True, max_instances=1,
                          misfire_grace_time=int(misfire_grace),
                          next_run_time=None if not run_now else now_utc())

        def on_missed(event):
            agent = by_id.get(event.job_id)
            if agent is not None:
                self.missed(agent, iso(event.scheduled_run_time))
        sched.add_listener(on_missed, EVENT_JOB_MISSED)

        def on_max_instances(event):
            agent = by_id.get(event.job_id)
            if agent is not None:
                self.still_running(agent, [iso(t)
                                           for t in event.scheduled_run_times or []])
        sched.add_listener(on_max_instances, EVENT_JOB_MAX_INSTANCES)
        sched.add_job(self.watch_inboxes, "interval", seconds=URGENT_POLL, args=[sched], id="inbox", coalesce=True,
                      max_instances=1, misfire_grace_time=None, executor="inbox")
        sched.start()
        names = ", ".join(a.name or "default" for a in self.agents)
        log.info("running %s: %s", names, f"every {every}" if every else f"cron {cron!r} (UTC)")
        seen_at = 0.0
        try:
            while not self.stopping.wait(0.5):
                if time.monotonic() - seen_at >= daemon_health.seen_every(len(self.agents)):
                    seen_at = time.monotonic()
                    self.seen()
        finally:
            self.seen(stopped=True)
            if poller is not None:
                poller.stop()
            sched.pause()
            for agent in self.agents:
                agent.cancel.set()  # running sessions stop at their next step or LLM call
            deadline = time.monotonic() + self.grace
            while any(a.running or a.scheduling.locked() for a in self.agents) and time.monotonic() < deadline:
                time.sleep(0.1)
            sched.shutdown(wait=False)
            for agent in self.agents:
                if agent.running:
                    self._force_interrupted(agent)
        log.info("stopped")
        return 0

    def _force_interrupted(self, agent: Agent) -> None:
        """A session that did not stop within the grace period: record it as interrupted, not crashed. Only
        while its lease is still this process's, and fenced by it: a session that lost its lease is the
        next holder's to record, and the breadcrumb may already be that holder's own running session."""
        store = agent.store
        if store is None:  # never opened: no session ran
            return
        try:
            owner = store.lease_owner(keys.WAKE_LEASE)
            if not (owner and owner.startswith(f"{host_name()}:{os.getpid()}:")):
                log.warning("%s: session still running after the grace period, its lease no longer this "
                            "process's; the wake that holds it records its end", agent.name or "default")
                return
            fenced = FencedStore(store, keys.WAKE_LEASE, owner)
            breadcrumb = karma_mod.read_breadcrumb(fenced)
            if breadcrumb and breadcrumb.get("id") and breadcrumb.get("lease") in (None, owner):
                session_history.close_dead_session(fenced, breadcrumb, outcomes.INTERRUPTED,
                                                   reason=f"shutdown grace period ({self.grace:.0f}s) ran out")
                # As a session interrupted in time would leave it: due again a minute on, not at the
                # pessimistic advance it set when it began.
                fenced.put(keys.WAKE_CONFIG, {"next_wake_after": iso(now_utc() + timedelta(seconds=60)),
                                              "sleep_seconds": 60, "set_by": breadcrumb["id"]})
                karma_mod.end_session(fenced, breadcrumb["id"])
            # Let the lease go now, or the next runtime waits out its time to live (and a call that comes
            # back later finds its writes refused: the lease is no longer its own).
            store.release_lease(keys.WAKE_LEASE, owner)
            log.warning("%s: session still running after the grace period; recorded as interrupted, its "
                        "lease released", agent.name or "default")
        except LeaseLost:
            log.warning("%s: session still running after the grace period lost its lease meanwhile; the wake "
                        "that holds it records its end", agent.name or "default")
        except StoreUnavailable:
            pass
