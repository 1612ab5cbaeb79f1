"""A bill above what was reserved for it: booked in full, and recorded.

Every request's worst case is reserved before it is sent, so a bill above it
means the host billed for something the price list does not know, or reported
a figure that does not add up. It is charged as billed, never less, and
recorded ``spend_overrun``; a reported cost well above the worst case is also
a ``cost_anomaly``, which ``brainstem status`` lists for the operator to
correct (``brainstem anomaly``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from brainstem.core import events
from brainstem.llm.pricing import ANOMALY_FACTOR, OVERRUN_SLACK, overran


def flag_overrun(record: Callable[..., Any], on_anomaly: Callable[[dict], None] | None, *, cost: float,
                 worst: float, source: str, model: str, tier: str, purpose: str) -> bool:
    """Record a call charged ``cost`` against the ``worst`` reserved for it; True when it overran."""
    if source == "provider" and cost > worst * ANOMALY_FACTOR + OVERRUN_SLACK:
        anomaly = {"model": model, "tier": tier, "reported": cost, "worst_case": round(worst, 10), "purpose": purpose}
        record(events.COST_ANOMALY, **anomaly, note="the host reported more than this call could cost; "
                                                    "charged as reported")
        if on_anomaly is not None:
            on_anomaly(anomaly)
    if not overran(cost, worst):
        return False
    record(events.SPEND_OVERRUN, model=model, tier=tier, purpose=purpose, cost=cost, worst_case=round(worst, 10),
           cost_source=source)
    return True
