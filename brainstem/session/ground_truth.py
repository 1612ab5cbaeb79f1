"""Facts the LLM cannot hallucinate: LLM credit, USDC balance, store usage; and the effort they imply.

The checks run in parallel, each under a deadline; a check that fails or
times out yields ``None`` ("unknown"), never an exception. Tripwires from
``config:defaults`` turn the facts into an effort level; an unknown value
fires no tripwire.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable
from typing import Any

from brainstem.core import events, keys
from brainstem.core.clock import iso, now_utc
from brainstem.core.templates import _MISSING, lookup
from brainstem.llm.credit import fetch_credit
from brainstem.session.wallet import usdc_balance
from brainstem.state.config import EFFORT_ORDER, Tripwire
from brainstem.tools.adapters import checked_number

Check = Callable[[], Any]

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


class Unknown(Exception):
    """A balance could not be read; the message says why (recorded in the ground_truth entry)."""


def known(read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``read(*args, why=[...], **kwargs)``, raising :class:`Unknown` with the reason when it gives None."""
    why: list[str] = []
    value = read(*args, why=why, **kwargs)
    if value is None and why:
        raise Unknown(why[-1])
    return value


def gather(checks: dict[str, Check], timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Run every check at once; (values, errors). A slow check is abandoned at ``timeout``.

    Each runs in a daemon thread: an abandoned check (a server that never answers) can neither
    hold the wake past its deadline nor keep the process from exiting afterwards.
    """
    values: dict[str, Any] = {name: None for name in checks}
    errors: dict[str, str] = {}
    results: dict[str, tuple[bool, Any]] = {}

    def run(name: str, fn: Check) -> None:
        try:
            results[name] = (True, fn())
        except Unknown as exc:
            results[name] = (False, str(exc)[:300])
        except Exception as exc:  # a check must never take the wake down
            results[name] = (False, f"{type(exc).__name__}: {exc}"[:300])

    threads = {name: threading.Thread(target=run, args=(name, fn), name=f"ground-truth-{name}", daemon=True)
               for name, fn in checks.items()}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + timeout
    for name, t in threads.items():
        t.join(max(0.0, deadline - time.monotonic()))
        if name not in results:
            errors[name] = f"timed out after {timeout:g}s"
            continue
        ok, value = results[name]
        if ok:
            values[name] = value
        else:
            errors[name] = value
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


def read_world(settings, store, karma, agent_kv, policy, timeout: float, dry_run: bool = False,
               llm_credit: tuple[float | None, str | None] | None = None) -> dict:
    """The session's ground truth: LLM credit and USDC balance (each through the agent's own checker
    first, in the sandbox, then the hard-coded one), and store usage, in parallel, each None on failure;
    recorded in karma and kept for ``status``. The agent's checkers are code under the operator's mode
    floors (``BRAINSTEM_TOOL_MODES``, by ``provider:NAME``), and a dry run runs none of them.
    ``llm_credit``: the credit the runtime read itself this wake, and why it is unknown (see
    :mod:`.credit_floor`): it is the LLM credit, and neither checker is asked again."""
    key = settings.llm_key

    def credit():
        if llm_credit is not None:
            if llm_credit[0] is None and llm_credit[1]:
                raise Unknown(llm_credit[1])
            return llm_credit[0]
        if key is None and settings.llm_server == "openrouter":
            return None  # nothing to ask without a key (the offline demo, a cassette)
        return known(fetch_credit, base_url=settings.llm_base_url, api_key=key, timeout=timeout)

    def wallet():
        if not settings.wallet_address:
            return None
        return known(usdc_balance, settings.base_rpc_url, settings.wallet_address, timeout=timeout)

    floors = settings.mode_floors()

    def dynamic_or(name, fallback):
        # The agent's own checker first (sandboxed), the hard-coded one when it fails.
        # Half the time for the agent's checker, so a hanging one leaves the fallback time to answer.
        return lambda: checked_number(store, name, fallback, agent_kv, karma.record, policy, timeout / 2,
                                      floors=floors, dry_run=dry_run)

    llm = credit if llm_credit is not None else dynamic_or("llm_balance", credit)  # the runtime's read, if made
    checks = {"kvUsage": store.usage, "openrouter": llm, "wallet_usdc": dynamic_or("wallet_balance", wallet)}
    # A generic server (LiteLLM, vLLM, Ollama, OpenAI) has no credit endpoint: nobody asks it, neither the
    # agent's checker nor the hard-coded one, and its credit is "not offered", not "unknown".
    not_offered = ["openrouter"] if settings.llm_server == "generic" else []
    for name in not_offered:
        del checks[name]
    values, errors = gather(checks, timeout=timeout + 1)
    balances = {"openrouter": values.get("openrouter"), "wallet_usdc": values.get("wallet_usdc")}
    karma.record(events.GROUND_TRUTH, balances=balances, kv_usage=values.get("kvUsage"), errors=errors or None,
                 not_offered=not_offered or None)
    store.put(keys.LAST_GROUND_TRUTH, {"at": iso(now_utc()), "balances": balances, "kvUsage": values.get("kvUsage"),
                                       **({"not_offered": not_offered} if not_offered else {})})
    return {"balances": balances, "kvUsage": values.get("kvUsage")}
