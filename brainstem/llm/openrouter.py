"""The hard-coded tier-3 LLM client: OpenRouter or any OpenAI-compatible server.

This is the provider safety net: when the agent's own
adapter in KV and its last working version both fail, this code still talks
to the model. It therefore depends on nothing the agent can change, and it
turns every failure into one exception type, :class:`ProviderError`, whose
message is a single line that is safe to log (never the API key, never the
request headers).

Retries (tenacity): HTTP 429 (honouring ``Retry-After``), 500/502/503/504,
connection and read failures, and an error object with a 429/5xx code inside
a 200 body. Exponential backoff with jitter, at most ``max_attempts`` attempts
in total. Any other 4xx, a body that is not JSON, or a body without choices is
not retried.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from brainstem import __version__
from brainstem.core.errors import one_line
from brainstem.core.json_numbers import count, finite
from brainstem.core.wire import DeadlineClock, deadline_transport, tls_context
from brainstem.llm.cache import cache_tokens
from brainstem.llm.messages import parse_tool_calls

__all__ = ["LLMResponse", "ProviderError", "chat", "RETRYABLE_STATUS"]


RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

# Transport failures worth another attempt. ReadError/WriteError cover a
# connection reset mid-request, which is as transient as a ConnectError.
_RETRYABLE_TRANSPORT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.PoolTimeout,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)

_MESSAGE_LIMIT = 300
_TITLE = "Brainstem"
_USER_AGENT = f"brainstem/{__version__}"


@dataclass
class LLMResponse:
    content: str
    usage: dict  # {"prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens", "cache_write_tokens",
    #               "cost" (float | None)}: prompt_tokens counts the cached and written ones too
    finish_reason: str | None
    truncated: bool  # finish_reason == "length"
    model: str  # the model the server says answered (fallback: the requested one)
    raw: dict  # the parsed response body
    attempts: int = field(default=1)  # how many HTTP attempts it took
    tool_calls: list = field(default_factory=list)  # flat calls, see brainstem.llm.messages


class ProviderError(Exception):
    """The provider could not give an answer. ``str(err)`` is one loggable line.

    ``status`` is the HTTP status (or the error code found in a 200 body) when
    there was one, else None. ``retryable`` says whether the failure was of a
    kind worth retrying (it has already been retried as far as allowed when
    :func:`chat` raises it). ``attempts`` is how many attempts were made.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        attempts: int = 1,
        malformed: bool = False,
        auth: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.attempts = attempts
        self.malformed = malformed  # the server answered, but not with a chat completion
        self.auth = auth  # the server refused the key in a 400 (see _key_refused)

    @property
    def kind(self) -> str | None:
        """Whose fault, when it is not the request's: ``auth`` (401/403, or a 400 about the key), ``no_credit`` (402),
        ``unavailable`` (5xx, 429, network, timeouts: transient), ``bad_response`` (an answer that is
        not a chat completion), else None (the request itself, e.g. an unknown model)."""
        if self.status in (401, 403) or self.auth:
            return "auth"
        if self.status == 402:
            return "no_credit"
        if self.retryable:
            return "unavailable"
        if self.malformed:
            return "bad_response"
        return None

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


# --------------------------------------------------------------------------- helpers


REDACTED = "[redacted]"  # what stands where a server echoed the key: the session's screen counts it as the key


def _redact(text: str, api_key: str | None) -> str:
    """A server echoing the key it was sent (in an auth error, say) must not make us log it. Where it was
    masked would answer a guess the agent had the server quote, so a session's screen counts a mask as the
    key itself: the error is withheld whole and the agent stopped."""
    if api_key:
        text = text.replace(api_key, REDACTED)
        if len(api_key) > 16:  # an echoed prefix of a long key is still most of a secret
            text = text.replace(api_key[:16], REDACTED)
    return text


def _parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or HTTP-date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        secs = (when - datetime.now(timezone.utc)).total_seconds()
    if math.isnan(secs) or math.isinf(secs):
        return None
    return max(0.0, secs)


def _int(v: Any) -> int:
    return count(v) or 0


def _error_fields(err: Any) -> tuple[str, int | None]:
    """(message, code) from an OpenAI/OpenRouter error object (dict or string)."""
    if isinstance(err, dict):
        msg = err.get("message")
        if msg is None:
            msg = err.get("error") or json.dumps(err)[:_MESSAGE_LIMIT]
        code = err.get("code")
        if isinstance(code, str) and code.isdigit():
            code = int(code)
        return str(msg), code if isinstance(code, int) and not isinstance(code, bool) else None
    return str(err), None


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                text = part.get("text")
                if isinstance(text, str) and kind in (None, "text", "output_text"):
                    parts.append(text)
        return "".join(parts)
    return str(content)


def _parse_usage(usage: Any) -> dict:
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("completion_tokens_details")
    details = details if isinstance(details, dict) else {}
    cached, written = cache_tokens(usage)
    return {
        "prompt_tokens": _int(usage.get("prompt_tokens")),
        "completion_tokens": _int(usage.get("completion_tokens")),
        "reasoning_tokens": _int(details.get("reasoning_tokens")),
        "cached_tokens": cached,
        "cache_write_tokens": written,
        "cost": finite(usage.get("cost")),
    }


def _parse_body(body: Any, requested_model: str) -> LLMResponse:
    if not isinstance(body, dict):
        raise ProviderError("openrouter: response was not a JSON object", malformed=True)
    if body.get("error") is not None:
        msg, code = _error_fields(body["error"])
        retryable = code in RETRYABLE_STATUS if code is not None else False
        raise ProviderError(
            f"openrouter: error in response{f' {code}' if code is not None else ''}: {one_line(msg, _MESSAGE_LIMIT)}",
            status=code,
            retryable=retryable,
        )
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ProviderError("openrouter: response had no choices", malformed=True)
    choice = choices[0]
    if choice.get("error") is not None:
        # OpenRouter reports a provider failure mid-generation inside the choice
        msg, code = _error_fields(choice["error"])
        raise ProviderError(
            f"openrouter: error in choice{f' {code}' if code is not None else ''}: {one_line(msg, _MESSAGE_LIMIT)}",
            status=code,
            retryable=code in RETRYABLE_STATUS if code is not None else False,
        )
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    content = _content_text(message.get("content"))
    finish = choice.get("finish_reason")
    finish = str(finish) if finish is not None else None
    model = body.get("model")
    return LLMResponse(
        content=content,
        usage=_parse_usage(body.get("usage")),
        finish_reason=finish,
        truncated=finish == "length",
        model=model if isinstance(model, str) and model else requested_model,
        raw=body,
        tool_calls=parse_tool_calls(message.get("tool_calls")),
    )


# A 400 that is about the key, not the request. LiteLLM's proxy answers a key it cannot check (no database
# behind it) with type no_db_connection, and others of its key errors with auth_error, expired_key or
# token_not_found_in_db; OpenAI-style servers say code invalid_api_key; the rest say it in words.
_KEY_ERROR_TYPES = frozenset({"no_db_connection", "auth_error", "authentication_error", "expired_key",
                              "token_not_found_in_db", "invalid_api_key", "unauthorized", "permission_denied"})
_KEY_ERROR_WORDS = re.compile(r"api[ _-]?key|authenticat|unauthori[sz]ed|credential|bearer|no connected db"
                              r"|invalid (proxy server )?token|expired key", re.IGNORECASE)


def _key_refused(status: int, body: Any, detail: str) -> bool:
    """Whether a 400 answer says the key was refused (so the operator's to fix, not the agent's)."""
    if status != 400:
        return False
    err = body.get("error") if isinstance(body, dict) else None
    fields = [err.get("type"), err.get("code")] if isinstance(err, dict) else []
    if any(isinstance(f, str) and f.lower() in _KEY_ERROR_TYPES for f in fields):
        return True
    return bool(_KEY_ERROR_WORDS.search(detail))


def _http_error(resp: httpx.Response) -> ProviderError:
    status = resp.status_code
    detail = ""
    try:
        body = resp.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    api_error = isinstance(body, dict) and body.get("error") is not None
    if api_error:
        detail, _ = _error_fields(body["error"])
    elif isinstance(body, dict) and isinstance(body.get("message"), str):
        detail = body["message"]
        api_error = body.get("object") == "error"  # vLLM's own error object: {"object": "error", "message": ...}
    else:
        try:
            detail = resp.text
        except Exception:  # noqa: BLE001 - undecodable body
            detail = ""
    detail = one_line(detail, _MESSAGE_LIMIT) or (resp.reason_phrase or "")
    retry_after = _parse_retry_after(resp.headers.get("retry-after")) if status in (429, 503) else None
    return ProviderError(
        f"openrouter: HTTP {status}: {detail}".rstrip(": ").rstrip(),
        status=status,
        retryable=status in RETRYABLE_STATUS,
        retry_after=retry_after,
        malformed=_not_the_api(status, api_error, detail),
        auth=_key_refused(status, body, detail),
    )


def _not_the_api(status: int, api_error: bool, detail: str) -> bool:
    """Whether an error answer says the URL is not an OpenAI-compatible API (the operator's setting)
    rather than that the request was wrong (the agent's: an unknown model, a bad parameter).

    An API rejects a request with a JSON ``error`` object; a web server, a proxy or a wrong path
    answers 404/405 or with HTML or text. A 404 that is the API's own word about a model (OpenRouter:
    "No endpoints found for ...") stays the request's."""
    if status in (401, 402, 403, 429) or status >= 500:
        return False
    if not api_error:
        return True
    return status in (404, 405) and "model" not in detail.lower()


def _headers(api_key: str | None) -> dict[str, str]:
    h = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "X-Title": _TITLE,  # how OpenRouter names the app on the operator's activity page
        "User-Agent": _USER_AGENT,
    }
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _timeout(timeout: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, connect=min(timeout, 10.0))


# --------------------------------------------------------------------------- chat


def chat(
    request: dict,
    *,
    base_url: str,
    api_key: str | None,
    timeout: float = 120.0,
    max_attempts: int = 4,
    backoff_base: float = 1.0,
    backoff_max: float = 30.0,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
    deadline: float | None = None,
) -> LLMResponse:
    """Send ``request`` (OpenAI chat shape) as-is and return the parsed answer.

    ``timeout`` bounds each attempt, every byte of it (not each read); ``deadline`` (a
    ``time.monotonic()`` value, the session's) bounds everything: all attempts and the backoff
    sleeps between them. Raises :class:`ProviderError` and nothing else.
    """
    clock = DeadlineClock(time.monotonic() + float(timeout))
    end = deadline if deadline is not None else float("inf")
    requested_model = str(request.get("model") or "") if isinstance(request, dict) else ""
    payload = _payload(request)
    url = f"{str(base_url).rstrip('/')}/chat/completions"
    headers = _headers(api_key)
    max_attempts = max(1, int(max_attempts))
    attempts = [0]  # the requests that went out (a try with no time left sends none)

    def once(client: httpx.Client) -> LLMResponse:
        now = time.monotonic()
        clock.deadline = min(now + float(timeout), end)
        if clock.deadline <= now:
            raise ProviderError("openrouter: the session's time ran out before the request", retryable=True)
        attempts[0] += 1
        return _post(client, url, payload, headers, clock.deadline - now, requested_model)

    try:
        with httpx.Client(transport=transport or deadline_transport(clock, tls_context()),
                          timeout=_timeout(timeout), verify=tls_context()) as client:
            result = _retrying(max_attempts, backoff_base, backoff_max, end, sleep)(once, client)
    except ProviderError as e:
        raise _final_error(e, attempts[0], api_key) from None
    except Exception as e:  # noqa: BLE001 - the safety net must not leak anything else
        raise ProviderError(
            _redact(f"openrouter: unexpected {type(e).__name__}: {one_line(e, _MESSAGE_LIMIT)}", api_key),
            attempts=attempts[0],
        ) from None
    result.attempts = attempts[0]
    return result


def _payload(request: dict) -> bytes:
    try:
        return json.dumps(request).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ProviderError("openrouter: request is not JSON-serialisable: "
                            f"{one_line(type(e).__name__, _MESSAGE_LIMIT)}") from None


def _retrying(max_attempts: int, backoff_base: float, backoff_max: float, end: float,
              sleep: Callable[[float], None]) -> Retrying:
    """The retry policy: a retryable :class:`ProviderError` is tried again, at most ``max_attempts`` in
    all, after the server's ``Retry-After`` or an exponential pause with jitter, never past ``end``."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        ra = getattr(exc, "retry_after", None)
        if ra is not None:
            d = min(float(ra), backoff_max)
        else:
            d = min(backoff_max, backoff_base * (2 ** (state.attempt_number - 1)))
            d = random.uniform(d / 2, d)
        return max(0.0, min(d, end - time.monotonic()))

    def out_of_time(state: RetryCallState) -> bool:
        return end - time.monotonic() <= 0.05

    return Retrying(
        stop=stop_after_attempt(max_attempts) | out_of_time,
        wait=wait,
        retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
        sleep=sleep,
        reraise=True,
    )


def _post(client: httpx.Client, url: str, payload: bytes, headers: dict[str, str], seconds: float,
          requested_model: str) -> LLMResponse:
    """One attempt: the request sent, with ``seconds`` for all of it, and its answer parsed."""
    try:
        resp = client.post(url, content=payload, headers=headers, timeout=_timeout(seconds))
    except _RETRYABLE_TRANSPORT as e:
        raise ProviderError(
            f"openrouter: {type(e).__name__}: {one_line(e, _MESSAGE_LIMIT) or 'no detail'}", retryable=True
        ) from None
    except httpx.HTTPError as e:  # bad URL, unsupported protocol, decoding...
        raise ProviderError(
            f"openrouter: {type(e).__name__}: {one_line(e, _MESSAGE_LIMIT) or 'no detail'}"
        ) from None
    if resp.status_code != 200:
        raise _http_error(resp)
    try:
        body = json.loads(resp.content)
    except (ValueError, UnicodeDecodeError):
        raise ProviderError("openrouter: response was not JSON", status=200, malformed=True) from None
    return _parse_body(body, requested_model)


def _final_error(e: ProviderError, attempts: int, api_key: str | None) -> ProviderError:
    """The error :func:`chat` raises: the last attempt's, saying how many were made, the key redacted."""
    msg = e.message
    if attempts > 1:
        msg = f"{msg} (after {attempts} attempts)"
    return ProviderError(
        _redact(msg, api_key),
        status=e.status,
        retryable=e.retryable,
        retry_after=e.retry_after,
        attempts=attempts,
        malformed=e.malformed,
        auth=e.auth,
    )
