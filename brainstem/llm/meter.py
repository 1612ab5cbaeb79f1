"""Spend on the wire: requests that sandboxed code sends to the LLM host, held to the chokepoint's rules.

An agent-written adapter or tool holds only a placeholder for the LLM key, so
every request it can make that costs money goes through ``ctx.fetch``, where
this meter sees it before it is sent and after it is answered:

* only ``POST …/chat/completions`` with a JSON body may reach the LLM host,
  besides the free reads named in :data:`FREE_READS` (``GET`` of the key's
  balance or the model list, with no body and no query); any other method or path, a body on a
  read, a query string, streaming, ``n`` > 1, server-side model lists and
  answers billed apart from tokens (audio, images, web search) are refused
  before they leave, since they could not be priced;
* the model must be the one the chokepoint asked for (or its fallback) during
  an adapter call, and a model in ``config:models`` for any other code;
* content parts that are not text (images, audio, files, in any message) cost
  the model's ``input_cost_per_part`` each; a request holding one for a model
  with no such price is refused;
* ``max_tokens`` is set, and clamped to the model's limit, to the adapter
  call's own ``max_tokens``, and to what the session's budget and today's
  ceiling still afford at the worst-case price; a request they cannot afford
  is refused;
* that worst case (every byte sent priced as prompt, every part at its price,
  every allowed output token spent) is held against the session and today's
  spend in the store before the request goes, so concurrent processes of one
  agent cannot book past the daily ceiling together;
* a request marked for prompt caching (``cache_control``) is priced as if all
  of its prompt were written to the cache at the model's write price, and is
  refused for a model whose cache prices ``config:models`` does not give;
* after the answer, the hold is settled at what the host reports
  (``usage.cost``), else the price list's cost of the reported tokens, else the
  worst case (also when the exchange failed after the request was sent).

So the host never bills more than the ceilings, save a bill above the
request's worst case: booked as billed, recorded ``spend_overrun`` (and a
reported one, ``cost_anomaly``, shown to the operator), and the code that sent
it is ended (:class:`SpendOverrun`): one request past the reservation, never two.
"""

from __future__ import annotations

import ipaddress
import json
import math
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, NoReturn

import httpx

from brainstem.core import events
from brainstem.core.json_numbers import count, finite
from brainstem.core.secrets import LLM_KEYS, normalise_host
from brainstem.llm.cache import cache_tokens, dearest_write, marked_ttls
from brainstem.llm.messages import MESSAGE_KEYS, non_text_parts, unknown_message_keys
from brainstem.llm.overrun import flag_overrun
from brainstem.llm.pricing import MIN_USEFUL_TOKENS, listed_cost, parts_cost, reported_prompt_tokens, worst_case_cost
from brainstem.state.budget import HOLD_MARGIN_S, Budget, BudgetExceeded
from brainstem.state.config import Models

DEFAULT_MAX_TOKENS = 4096
# No request sandboxed code sends outlives the code, whose timeout is at most 300 s (tools.MAX_TIMEOUT_MS).
WIRE_HOLD_S = 300.0 + HOLD_MARGIN_S
REFUSED_FIELDS = {"stream": "streamed answers cannot be metered", "models": "a server-side model list cannot be priced",
                  "best_of": "best_of multiplies the cost", "plugins": "plugins are billed outside the token price",
                  "audio": "an audio answer is billed apart from tokens",
                  "web_search_options": "a web search is billed apart from tokens"}
# What sandboxed code may ask the LLM host besides chat completions: reads known to be free (the key's
# balance, the model list), with no body and no query (paths under the base URL's). Anything else is refused
# before it leaves.
FREE_READS = frozenset({("GET", "/key"), ("GET", "/credits"), ("GET", "/models")})
MAX_TOKENS_EVER = 10_000_000  # no model answers more; keeps the price arithmetic within floats


class MeterRefused(Exception):
    """The request may not be sent (message for the tool)."""


class SpendOverrun(Exception):
    """A request was billed above its reservation: booked and recorded; the code that sent it must end."""


class WireMeter:
    def __init__(self, *, models: Models, budget: Budget, record: Callable[..., Any], llm_base_url: str,
                 on_cost: Callable[[float], None] | None = None, on_anomaly: Callable[[dict], None] | None = None,
                 operator_ids: frozenset[str] = frozenset()):
        """``operator_ids``: the models the operator's own price list names; a variant id (``x:online``)
        may be sent only when it is one of them."""
        url = httpx.URL(llm_base_url)
        self.host = normalise_host(url.host or "")
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.base_path = url.path.rstrip("/")
        self.models = models
        self.budget = budget
        self.record = record
        self.on_cost = on_cost
        self.on_anomaly = on_anomaly
        self._call: dict | None = None  # the chokepoint's adapter call in progress
        self._addresses: frozenset[str] | None = None
        self.operator_ids = operator_ids

    # --- the chokepoint's side
    @contextmanager
    def adapter_call(self, *, model: str, fallback: str | None, max_tokens: int, use_reserve: bool):
        """While an adapter answers one chokepoint call: what it may ask for, and what it spent."""
        self._call = {"models": {model, fallback} - {None}, "max_tokens": max_tokens, "use_reserve": use_reserve,
                      "cost": 0.0, "requests": 0}
        try:
            yield self._call
        finally:
            self._call = None

    # --- the fetch guard's side
    def local_addresses(self) -> frozenset[str]:
        """The LLM host's addresses when they are loopback or private (a local proxy, say), so another
        spelling of it (``localhost``, ``127.1``, ``0x7f.0.0.1``) is the LLM host too. A public host's
        addresses are shared with other sites (a CDN), and its key is bound to its name: its name decides."""
        if self._addresses is None:
            try:
                infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
                found = {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}
            except (OSError, ValueError, UnicodeError):
                found = set()
            self._addresses = frozenset(str(ip) for ip in found if ip.is_loopback or ip.is_private)
        return self._addresses

    def is_llm_host(self, host: str, ip: str | None = None) -> bool:
        return host == self.host or (ip is not None and ip in self.local_addresses())

    def applies(self, host: str, port: int, injected: list[str], ip: str | None = None) -> bool:
        return (self.is_llm_host(host, ip) and port == self.port) or not LLM_KEYS.isdisjoint(injected)

    def before(self, method: str, path: str, body: bytes | None, note: dict, query: str = "") -> bytes | None:
        """The body to send (``max_tokens`` set and clamped); :class:`MeterRefused` when it may not go."""
        req = self._chat_request(method, path, body, query)
        if req is None:
            return body  # a free read
        model_id, limit, use_reserve = self._terms(req)
        if self.budget.time_left(use_reserve) <= 0:
            raise MeterRefused("refused: the session has no time left for another LLM request")
        parts = non_text_parts(req)
        parts_usd = parts_cost(self.models, model_id, sum(parts.values()))
        if parts_usd is None:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(parts.items()))
            raise MeterRefused(f"refused: the request holds content parts that are not text ({kinds}), which the "
                               f"host bills apart from tokens; config:models gives {model_id} no "
                               f"input_cost_per_part, so they cannot be priced")
        ttls = marked_ttls(req)
        write = dearest_write(self.models.cache_prices(model_id), ttls)
        if write is None:
            raise MeterRefused(f"refused: the request is marked for prompt caching ({', '.join(sorted(ttls))}); "
                               f"config:models gives {model_id} no cache prices for that, so its cache writes "
                               f"cannot be priced")
        req.pop("max_completion_tokens", None)
        req["model"], req["max_tokens"] = model_id, limit
        # Everything the host reads is priced as prompt (tools, response_format, a raw prompt...): the body
        # as it is sent, measured with ``limit`` before any clamping (clamping only shortens it). Marked for
        # caching, all of it may be written to the cache, and none of it read from there.
        chars = len(_encode(req))
        left, binding = self.budget.headroom(use_reserve)
        worst = worst_case_cost(self.models, model_id, chars, limit, parts_usd, write)
        if worst > left or left <= 0:
            p_out = self.models.prices(model_id)[1]
            input_cost = worst_case_cost(self.models, model_id, chars, 0, parts_usd, write)
            affordable = math.floor((left - input_cost) * 1e6 / p_out) if p_out > 0 else limit
            # Nothing left is a stop even for a model priced at zero.
            if left <= 0 or affordable < min(MIN_USEFUL_TOKENS, limit):
                self._refuse(binding, model_id, worst, use_reserve, left)
            limit = affordable
            worst = worst_case_cost(self.models, model_id, chars, limit, parts_usd, write)
        try:
            hold = self.budget.reserve(worst, use_reserve=use_reserve, ttl_s=WIRE_HOLD_S)
        except BudgetExceeded as exc:  # another process of the agent spent the rest of today's meantime
            self._refuse("daily" if exc.limit == "daily" else "cost", model_id, worst, use_reserve, None)
        req["max_tokens"] = limit
        note.update(model=model_id, max_tokens=limit, worst_case=round(worst, 10), t0=time.monotonic(),
                    request=req, hold=hold, cache_write=write if ttls else None)
        if parts:
            note["parts"] = sum(parts.values())
        return _encode(req)

    def _chat_request(self, method: str, path: str, body: bytes | None, query: str) -> dict | None:
        """The chat request a request to the LLM host is, None for a free read; :class:`MeterRefused` for
        anything else: what the meter cannot price never leaves."""
        sub = path.rstrip("/")
        sub = sub[len(self.base_path):] if sub.startswith(self.base_path) else None
        if (method, sub) in FREE_READS and not body and not query:
            return None
        if query:
            raise MeterRefused("refused: a request to the LLM host may not carry a query string (the meter "
                               "cannot price what it says)")
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            free = " and ".join(f"{m} {self.base_path}{p}" for m, p in sorted(FREE_READS))
            raise MeterRefused(f"refused: {method} {path}{' with a body' if body else ''} on the LLM host cannot be "
                               f"metered; only POST …/chat/completions (and {free}, with no body) may be sent "
                               f"from the sandbox")
        try:
            req = json.loads(body or b"")
        except ValueError:
            req = None
        if not isinstance(req, dict):
            raise MeterRefused("refused: a chat/completions request to the LLM host must have a JSON object body")
        for name, why in REFUSED_FIELDS.items():
            if req.get(name):
                raise MeterRefused(f"refused: {name!r} in a request to the LLM host ({why})")
        if req.get("n") not in (None, 1):
            raise MeterRefused("refused: n must be 1 in a request to the LLM host (each answer is billed)")
        if req.get("modalities") not in (None, ["text"]):
            raise MeterRefused("refused: 'modalities' other than text in a request to the LLM host (an image or "
                               "audio answer is billed apart from tokens)")
        tools = req.get("tools")
        if tools is not None and (not isinstance(tools, list) or any(
                not isinstance(t, dict) or t.get("type") != "function" for t in tools)):
            raise MeterRefused("refused: a tool in a request to the LLM host that is not a function (a "
                               "server-side tool such as web search is billed apart from tokens)")
        unknown = unknown_message_keys(req)
        if unknown:
            raise MeterRefused(f"refused: messages to the LLM host with {', '.join(unknown[:5])!r} (a message may "
                               f"hold only {', '.join(sorted(MESSAGE_KEYS))}): the meter cannot price it")
        return req

    def _terms(self, req: dict) -> tuple[str, int, bool]:
        """(the model id, the ``max_tokens`` it may ask for, whether the reflection reserve is usable)."""
        name = req.get("model")
        model_id = self.models.resolve(name) if isinstance(name, str) else None
        call = self._call
        if call is not None:
            if model_id not in call["models"] and name not in call["models"]:
                raise MeterRefused(f"refused: the adapter asked for model {name!r}; this call may use "
                                   f"{' or '.join(sorted(call['models']))}")
            model_id = model_id or name
        elif model_id is None:
            raise MeterRefused(f"refused: model {name!r} is not in config:models, so it cannot be priced")
        elif model_id not in self.operator_ids:
            # What a model bills beside tokens (a search per request) is known only to whoever chose it: code
            # of its own accord calls only the models the operator's price list names.
            raise MeterRefused(f"refused: model {model_id!r} is not in the operator's config:models; code may "
                               f"call only models the operator listed")
        if ":" in model_id.rsplit("/", 1)[-1] and model_id not in self.operator_ids:
            # A variant (":online", ":nitro") changes what the host bills beside tokens: only as the operator
            # priced it.
            raise MeterRefused(f"refused: model {model_id!r} is a variant your config:models does not name "
                               f"(a variant such as :online is billed apart from tokens)")
        info = self.models.info(model_id)
        asked = req.get("max_tokens", req.get("max_completion_tokens"))
        limit = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None
        limit = limit or (info.max_output_tokens if info and info.max_output_tokens else DEFAULT_MAX_TOKENS)
        if info is not None and info.max_output_tokens:
            limit = min(limit, info.max_output_tokens)
        if call is not None:
            limit = min(limit, call["max_tokens"])
        return model_id, min(limit, MAX_TOKENS_EVER), bool(call and call["use_reserve"])

    def _refuse(self, limit: str, model_id: str, worst: float, use_reserve: bool,
                left: float | None) -> NoReturn:
        daily = self.budget.daily
        if limit == "daily" and daily is not None:
            left = daily.left() if left is None else left
            self.record(events.BUDGET_EXCEEDED, limit="daily", purpose="wire", model=model_id,
                        spent=round(daily.ceiling - left, 6), budget=round(daily.ceiling, 6),
                        worst_case=round(worst, 6))
            raise MeterRefused(f"refused: this LLM request could cost ${worst:.4f}; today's ceiling has "
                               f"${max(0.0, left):.4f} left")
        ceiling = self.budget.cost_ceiling(use_reserve)
        left = ceiling - self.budget.spent - self.budget.held if left is None else left
        self.record(events.BUDGET_EXCEEDED, limit="cost", purpose="wire", model=model_id,
                    spent=round(self.budget.spent, 6), budget=round(ceiling, 6), worst_case=round(worst, 6))
        raise MeterRefused(f"refused: this LLM request could cost ${worst:.4f}; the session has "
                           f"${max(0.0, left):.4f} left")

    def after(self, note: dict, status: int | None, text: str | None, error: str | None, tool: str) -> float:
        """Charge one answered (or failed) request; returns the cost."""
        if "worst_case" not in note:
            return 0.0  # a free GET
        worst = note["worst_case"]
        usage, content, source = None, None, "worst_case"
        if text:
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if isinstance(data, dict):
                usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
                choices = data.get("choices")
                if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                    message = choices[0].get("message")
                    content = message.get("content") if isinstance(message, dict) else None
        tokens_in = _count(usage, "prompt_tokens")
        tokens_out = _count(usage, "completion_tokens")
        read, written = cache_tokens(usage)
        if tokens_in is not None:
            tokens_in = reported_prompt_tokens({"prompt_tokens": tokens_in, "cached_tokens": read,
                                                "cache_write_tokens": written})
        reported = usage.get("cost") if usage else None
        listed = listed_cost(self.models, note["model"], tokens_in or 0, tokens_out or 0, read, written,
                             note.get("cache_write"))
        if finite(reported) is not None and reported >= 0:
            # A cached request's bill is never believed below the price list's cost of the tokens reported.
            cached = note.get("cache_write") is not None or (
                self.models.cache_prices(note["model"]) is not None and bool(read or written))
            cost, source = max(float(reported), listed) if cached else float(reported), "provider"
        elif tokens_in is not None or tokens_out is not None:
            cost, source = listed, "price_list"
        elif status is not None and not 200 <= status < 300 and error is None:
            cost, source = 0.0, "not_billed"  # the host answered with an error and reported no usage
        else:
            cost = worst  # sent, and nothing says what it cost: assume the worst
        cost = round(cost, 10)
        self.budget.settle(note.pop("hold", None), cost)  # in place of the worst case held before it went
        if self.on_cost is not None:
            self.on_cost(cost)
        note.update(cost=cost, cost_source=source)
        call = self._call
        if call is not None:
            call["cost"] += cost
            call["requests"] += 1
        else:
            # Code outside an adapter call: its own llm_call entry, so a session's cost is still
            # the sum of its llm_call entries.
            self.record(events.LLM_CALL, purpose=f"tool:{tool}", model=note["model"], tier="sandbox",
                        input_tokens=tokens_in or 0, output_tokens=tokens_out or 0, cost=cost,
                        cached_tokens=read or None, cache_write_tokens=written or None,
                        cost_source=source, duration_ms=int((time.monotonic() - note["t0"]) * 1000),
                        status=status, error=error, request=note.get("request"), response=content)
        if flag_overrun(self.record, self.on_anomaly, cost=cost, worst=worst, source=source, model=note["model"],
                        tier="wire", purpose=f"tool:{tool}"):
            raise SpendOverrun(f"stopped: spend_overrun: the LLM host billed ${cost:.6f} for a request whose worst "
                               f"case was ${worst:.6f}; booked as billed, and the code that sent it ended")
        return cost


def _encode(req: dict) -> bytes:
    return json.dumps(req, ensure_ascii=False).encode("utf-8")


def _count(usage: dict | None, name: str) -> int | None:
    return count(usage.get(name)) if usage else None
