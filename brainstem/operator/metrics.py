"""Prometheus metrics for ``brainstem run --metrics-port N``.

The daemon counts what it does: each fire (``ran``, ``asleep``, ``skipped``,
``missed``, ``error``), and, from the karma of the sessions it runs (a karma
listener, so the count is what the flight recorder holds), each session's
outcome, duration and cost (what moved money: not a cassette's simulated answers), each LLM call by
tier and model, each tool run by result. Today's spend and the daily ceiling, the LLM credit last seen and
the runway it gives are read from the store when Prometheus scrapes. Imported only by ``run`` when metrics
are asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from brainstem.core import events

WAKE_RESULTS = {"ran": "ran", "asleep": "asleep", "skipped": "skipped", "missed": "missed", "error": "error",
                "lease_lost": "ran"}  # a session ran, and its lease was lost: counted in brainstem_lease_lost too
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, float("inf"))
COST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, float("inf"))


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.wakes = Counter("brainstem_wakes", "Scheduled fires by result", ["agent", "result"], registry=r)
        self.sessions = Counter("brainstem_sessions", "Sessions by outcome", ["agent", "outcome"], registry=r)
        self.duration = Histogram("brainstem_session_duration_seconds", "Session wall-clock time", ["agent"],
                                  buckets=DURATION_BUCKETS, registry=r)
        self.cost = Histogram("brainstem_session_cost_usd", "Session cost in USD", ["agent"], buckets=COST_BUCKETS,
                              registry=r)
        self.llm_calls = Counter("brainstem_llm_calls", "LLM calls by tier and model", ["agent", "tier", "model"],
                                 registry=r)
        self.tool_runs = Counter("brainstem_tool_runs", "Tool runs by result (ok, error, not_run)",
                                 ["agent", "result"], registry=r)
        self.lease_lost = Counter("brainstem_lease_lost", "Sessions stopped because their wake lease was lost",
                                  ["agent"], registry=r)
        self._spend: dict[str, Callable[[], tuple]] = {}
        r.register(_ReadCollector(self._spend, (("brainstem_spend_today_usd", "LLM spend today (UTC)"),
                                                ("brainstem_daily_ceiling_usd", "The operator's daily ceiling"))))
        self._credit: dict[str, Callable[[], tuple]] = {}
        r.register(_ReadCollector(self._credit, (
            ("brainstem_llm_credit_usd", "The LLM server's balance last read (absent: unknown or not offered)"),
            ("brainstem_runway_days", "Days the LLM balance lasts at the last 7 days' mean spend (absent: unknown)"))))

    def watch_spend(self, agent: str, read: Callable[[], tuple[float, float]]) -> None:
        """``read()`` -> (spent today, daily ceiling), asked at each scrape."""
        self._spend[agent] = read
        self.lease_lost.labels(agent=agent)  # present from the start, at 0
        for result in WAKE_RESULTS.values():
            self.wakes.labels(agent=agent, result=result)

    def watch_credit(self, agent: str, read: Callable[[], tuple[float | None, float | None]]) -> None:
        """``read()`` -> (the LLM credit last seen, the runway it gives), None where unknown; asked at each scrape."""
        self._credit[agent] = read

    def fire(self, agent: str, fire: str) -> None:
        self.wakes.labels(agent=agent, result=WAKE_RESULTS.get(fire, "error")).inc()

    def listener(self, agent: str) -> Callable[[dict], None]:
        """A karma listener counting one session's entries as they are recorded."""
        def on_entry(e: dict[str, Any]) -> None:
            event = e.get("event")
            if event == events.LLM_CALL:
                self.llm_calls.labels(agent=agent, tier=str(e.get("tier")), model=str(e.get("model"))).inc()
            elif event == events.TOOL_COMPLETE:
                self.tool_runs.labels(agent=agent, result="ok" if e.get("ok") else "error").inc()
            elif event == events.TOOL_WOULD_DO:
                self.tool_runs.labels(agent=agent, result="not_run").inc()
            elif event == events.LEASE_LOST:
                self.lease_lost.labels(agent=agent).inc()
            elif event == events.SESSION_END:
                self.sessions.labels(agent=agent, outcome=str(e.get("outcome"))).inc()
                if isinstance(e.get("duration_ms"), (int, float)):
                    self.duration.labels(agent=agent).observe(e["duration_ms"] / 1000)
                if isinstance(e.get("cost"), (int, float)):
                    # What moved money: a cassette's answers (simulated_cost) are no spend.
                    simulated = e.get("simulated_cost") if isinstance(e.get("simulated_cost"), (int, float)) else 0
                    self.cost.labels(agent=agent).observe(max(0.0, e["cost"] - simulated))
        return on_entry


class _ReadCollector:
    """Gauges read from the store at each scrape: ``read()`` gives one value per family, None for one not
    known (its sample is left out: an unknown balance is no balance of 0)."""

    def __init__(self, readers: dict[str, Callable[[], tuple]], families: tuple[tuple[str, str], ...]):
        self.readers, self.families = readers, families

    def collect(self):
        gauges = [GaugeMetricFamily(name, doc, labels=["agent"]) for name, doc in self.families]
        for agent, read in list(self.readers.items()):
            try:
                values = read()
            except Exception:  # noqa: BLE001 - a store that is away must not break the scrape
                continue
            for gauge, value in zip(gauges, values, strict=False):
                if value is not None:
                    gauge.add_metric([agent], value)
        yield from gauges


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1"):
    """Serve ``/metrics`` in a daemon thread; returns (server, thread)."""
    from brainstem.sandbox import own_ports

    server = start_http_server(port, addr=host, registry=metrics.registry)
    own_ports.register(server[0].server_port if isinstance(server, tuple) else port)  # tools never fetch it
    return server
