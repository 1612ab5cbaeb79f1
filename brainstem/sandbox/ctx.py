"""The runtime side of a worker's ``ctx``: the :class:`Services` it is served from, and one request's answer.

Every ``ctx`` call a worker makes (``kv_get``, ``kv_put``, ``kv_list``,
``kv_delete``, ``log``, ``fetch``, ``send_telegram``) arrives in the runtime process as a JSON
request; :func:`answer` checks it, calls ``services`` *in this process* and
returns the JSON answer, a value or one line of error text, scrubbed like
everything handed back.  ``services.inspect`` sees every request first, and
may stop the run (:class:`StopExecution`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

from brainstem.sandbox.protocol import NotJSON, to_plain

MAX_RESPONSE_BYTES = 8 * 1024 * 1024  # runtime -> worker ctx response
MAX_SERVICE_ERROR_CHARS = 1000
KV_OPS = ("kv_get", "kv_put", "kv_list", "kv_delete")


class Services(Protocol):
    """The runtime side of ``ctx``; every call happens in the process that called ``run``."""

    secrets: Mapping[str, str]  # already filtered by the runtime
    kv_access: str  # "none" | "own" | "read_all"

    def kv_get(self, key: str) -> str | None: ...

    def kv_put(self, key: str, value: str) -> None: ...

    def kv_list(self, prefix: str) -> list[str]: ...

    def kv_delete(self, key: str) -> bool: ...

    def fetch(self, url, method, headers, json, data, timeout) -> dict: ...

    def log(self, message: str) -> None: ...

    # The operator's chat: the runtime sends ``text`` with the bot token, which the worker never holds.
    def send_telegram(self, text: str, timeout: float) -> dict: ...

    # The one way back in and the one way out: every value handed to the worker passes ``scrub``, and
    # everything the worker sends passes ``inspect``, which raises :class:`StopExecution` when it holds
    # something it must not (a secret's value: the worker could only have it through a leak or a guess).
    def scrub(self, value: Any) -> Any: ...

    def inspect(self, value: Any) -> None: ...


class StopExecution(Exception):
    """Raised by ``Services``: kill the worker at once; the message is the run's error."""


class _Refused(Exception):
    """A request the runtime will not serve; the message is the tool's error."""


def scrub_with(services: Services, value: Any) -> Any:
    scrub = getattr(services, "scrub", None)
    return value if scrub is None else scrub(value)


def inspect_with(services: Services, value: Any) -> None:
    inspect = getattr(services, "inspect", None)
    if inspect is not None:
        inspect(value)


def answer(services: Services, op: Any, msg: dict, kv_granted: bool, deadline: float) -> dict:
    """One ctx request; its answer (value or error text) is scrubbed like everything handed back.

    ``deadline`` (monotonic) is the run's: a fetch gets no more than the time left.
    Raises :class:`StopExecution` when ``services`` says so.
    """
    try:
        inspect_with(services, msg)
        value = _dispatch(services, op, msg, kv_granted, deadline)
    except StopExecution:
        raise
    except _Refused as e:
        return scrub_with(services, {"ok": False, "error": str(e)})
    except Exception as e:  # noqa: BLE001 - services errors become the tool's RuntimeError
        return scrub_with(services, {"ok": False, "error": _service_error(e)})
    return scrub_with(services, {"ok": True, "value": value})


def _dispatch(services: Services, op: Any, msg: dict, kv_granted: bool, deadline: float) -> Any:
    if op in KV_OPS and not kv_granted:
        raise _Refused("kv access is not granted to this tool")
    if op == "kv_get":
        value = services.kv_get(_str_arg(msg, "key"))
        if value is not None and type(value) is not str:
            value = str(value)
        return value
    if op == "kv_put":
        services.kv_put(_str_arg(msg, "key"), _str_arg(msg, "value"))
        return None
    if op == "kv_list":
        keys = services.kv_list(_str_arg(msg, "prefix"))
        return [str(k) for k in keys]
    if op == "kv_delete":
        return bool(services.kv_delete(_str_arg(msg, "key")))
    if op == "log":
        services.log(_str_arg(msg, "message"))
        return None
    if op == "fetch":
        return _fetch(services, msg, deadline)
    if op == "send_telegram":
        return services.send_telegram(_str_arg(msg, "text"), max(0.1, deadline - time.monotonic()))
    raise _Refused(f"unknown ctx operation {str(op)[:40]!r}")


def _fetch(services: Services, msg: dict, deadline: float) -> Any:
    """``ctx.fetch``: within the time the run has left, whatever timeout the tool asked for."""
    remaining = max(0.1, deadline - time.monotonic())
    timeout = msg.get("timeout")
    if type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout <= 0:
        timeout = remaining
    headers = msg.get("headers")
    result = services.fetch(
        url=_str_arg(msg, "url"),
        method=_str_arg(msg, "method"),
        headers=dict(headers) if type(headers) is dict else None,
        json=msg.get("json"),
        data=msg.get("data"),
        timeout=min(float(timeout), remaining),
    )
    try:
        return to_plain(result, max_bytes=MAX_RESPONSE_BYTES - 1024, what="fetch response")
    except NotJSON as e:
        raise _Refused(str(e)) from None


def _service_error(e: BaseException) -> str:
    try:
        msg = str(e)
    except Exception:  # noqa: BLE001
        msg = ""
    msg = msg or type(e).__name__
    return msg[:MAX_SERVICE_ERROR_CHARS]


def _str_arg(msg: dict, name: str) -> str:
    value = msg.get(name)
    if type(value) is not str:
        raise _Refused(f"{name} must be a str")
    return value
