"""Facts the LLM cannot hallucinate: LLM credit, USDC balance, store usage; and the effort they imply.

The checks run in parallel, each under a deadline; a check that fails or
times out yields ``None`` ("unknown"), never an exception. Tripwires from
``config:defaults`` turn the facts into an effort level; an unknown value
fires no tripwire.
"""

from __future__ import annotations

import concurrent.futures as cf
import operator
import time
from collections.abc import Callable
from typing import Any

from .config import EFFORT_ORDER, Tripwire
from .templates import _MISSING, lookup

Check = Callable[[], Any]

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


def gather(checks: dict[str, Check], timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Run every check at once; (values, errors). A slow check is abandoned at ``timeout``."""
    values: dict[str, Any] = {name: None for name in checks}
    errors: dict[str, str] = {}
    pool = cf.ThreadPoolExecutor(max_workers=max(1, len(checks)), thread_name_prefix="ground-truth")
    try:
        futures = {pool.submit(fn): name for name, fn in checks.items()}
        deadline = time.monotonic() + timeout
        for fut, name in futures.items():
            try:
                values[name] = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except cf.TimeoutError:
                errors[name] = f"timed out after {timeout:g}s"
            except Exception as exc:  # a check must never take the wake down
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return values, errors


def fired_tripwires(tripwires: list[Tripwire], facts: dict[str, Any]) -> list[Tripwire]:
    fired = []
    for tw in tripwires:
        value = lookup(facts, tw.field)
        if value is _MISSING or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if _OPS[tw.op](value, tw.value):
            fired.append(tw)
    return fired


def effort_for(base: str, fired: list[Tripwire]) -> str:
    """The highest of the base effort and every fired tripwire's effort."""
    levels = [base] + [tw.effort for tw in fired]
    return max((lv for lv in levels if lv in EFFORT_ORDER), key=EFFORT_ORDER.index, default="low")
