"""The LLM server's credit: OpenRouter's ``/key``, then its ``/credits``.

Only OpenRouter offers these endpoints. A generic OpenAI-compatible server (LiteLLM's proxy, vLLM,
Ollama, OpenAI) offers none, so it is never asked (see ``Settings.llm_server``): its credit is "not
offered by this server", which is not "unknown".
"""

from __future__ import annotations

import time

import httpx

from brainstem.core.errors import one_line
from brainstem.core.json_numbers import finite
from brainstem.core.wire import deadline_transport, tls_context
from brainstem.llm.openrouter import _MESSAGE_LIMIT, _headers, _redact, _timeout

__all__ = ["fetch_credit"]


def fetch_credit(
    *,
    base_url: str,
    api_key: str | None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
    why: list[str] | None = None,
) -> float | None:
    """Remaining credit in USD, or None when it cannot be known. Never raises, never retries.

    ``GET {base}/key`` -> ``data.limit_remaining`` when it is a number (a key
    without a limit answers null); otherwise ``GET {base}/credits`` ->
    ``data.total_credits - data.total_usage`` (needs a management key).
    When it gives None, ``why`` (a list) is told the reasons, one line each.
    """
    reasons: list[str] = []
    try:
        base = str(base_url).rstrip("/")
        headers = _headers(api_key)
        headers.pop("Content-Type", None)
        # One deadline for both requests, every byte of them: a dripping server cannot hold ground truth.
        deadline = time.monotonic() + timeout
        with httpx.Client(transport=transport or deadline_transport(deadline, tls_context()), timeout=_timeout(timeout),
                          verify=tls_context()) as client:

            def data(path: str) -> dict | None:
                try:
                    r = client.get(f"{base}{path}", headers=headers)
                    if r.status_code != 200:
                        reasons.append(f"{path}: HTTP {r.status_code}")
                        return None
                    body = r.json()
                except Exception as exc:  # noqa: BLE001
                    reasons.append(f"{path}: {type(exc).__name__}: {one_line(exc, _MESSAGE_LIMIT)}")
                    return None
                d = body.get("data") if isinstance(body, dict) else None
                if not isinstance(d, dict):
                    reasons.append(f"{path}: no data object in the answer")
                return d if isinstance(d, dict) else None

            d = data("/key")
            if d is not None:
                remaining = finite(d.get("limit_remaining"))
                if remaining is not None:
                    return remaining
                reasons.append("/key: the key has no spending limit")
            d = data("/credits")
            if d is not None:
                total, used = finite(d.get("total_credits")), finite(d.get("total_usage"))
                if total is not None and used is not None:
                    return total - used
                reasons.append("/credits: no total_credits/total_usage numbers")
    except Exception as exc:  # noqa: BLE001 - a balance checker never breaks a wake
        reasons.append(f"{type(exc).__name__}: {one_line(exc, _MESSAGE_LIMIT)}")
    if why is not None:
        why.append(_redact("; ".join(reasons) or "unknown", api_key))
    return None
