"""The one way any code calls a model.

Before a call: resolve the alias, price it at its worst case (every prompt
character a third of a token, every allowed output token spent; a model with
no known price costs as much as the dearest known one), and refuse, or shrink
``max_tokens`` to what the budget still affords, if the session would pass its
cost or time budget or today's ceiling; then hold that worst case against the
session and against today's spend in the store, so concurrent spenders cannot
book past the ceiling together. After it: settle the hold at the cost (the
provider's ``usage.cost`` when it reports one, else the price list) and record
an ``llm_call`` karma entry; a cost above the worst case held is charged as
billed, never less, and recorded ``spend_overrun`` (see :mod:`.overrun`).

A provider whose ``simulated`` attribute is true (a cassette) moves no money: its
calls are priced, held and charged against the session's budget exactly as real
ones (so budgets bound a cassette session the same way), but never held against
today's ceiling nor added to today's spend; their ``llm_call`` entries say
``simulated: true`` and their cost is noted apart, as today's simulated spend.

Prompt caching (see :mod:`.cache`): a prompt given in parts, stable first, and
a conversation the caller expects to send again (``reuse``), carry the
provider's cache markers where the model's cache prices say a marker pays. The
worst case held then prices every prompt token at the write price (never a
hit); the cost booked is the server's ``usage.cost``, never below the price
list's cost of the reported uncached, cached and written tokens.

The soul is the system message of every call; no template can leave it out.
Providers are tried in order (the dynamic adapter, the last working one, the
hard-coded client); if all fail, the fallback model is tried once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from brainstem.core import events
from brainstem.core.outcomes import PROVIDER_FAULTS
from brainstem.llm.cache import (
    MAX_MARKERS,
    TTL_SECONDS,
    Reuse,
    as_parts,
    cache_tokens,
    dearest_write,
    mark,
    marked_ttls,
    prefix_key,
    ttl_that_pays,
    unmarked,
)
from brainstem.llm.messages import request_chars, text_of
from brainstem.llm.openrouter import REDACTED, LLMResponse, ProviderError
from brainstem.llm.overrun import flag_overrun
from brainstem.llm.pricing import (
    MIN_USEFUL_TOKENS,
    estimated_tokens,
    implausible_prompt,
    listed_cost,
    reported_prompt_tokens,
    worst_case_cost,
)
from brainstem.llm.providers import Provider
from brainstem.state.budget import HOLD_MARGIN_S, Budget, BudgetExceeded, dollars
from brainstem.state.config import Models

DEFAULT_CALL_TIMEOUT = 120.0
TRUSTED_TIERS = ("hardcoded", "cassette", "replay")  # usage reported by code the agent cannot edit
EFFORT_TO_REASONING = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


WITHHELD = "[withheld: the answer held secret text]"
WITHHELD_ERROR = "[withheld: the error held secret text]"


class LLMError(Exception):
    """Every provider (and the fallback model) failed, or the model is unknown.

    ``fault`` is an outcome name (:mod:`brainstem.core.outcomes`) when the hard-coded tier, which the
    agent cannot break, failed for a reason that is the operator's or the provider's, not the
    agent's config: ``llm_auth_failed`` (401/403), ``llm_no_credit`` (402), ``llm_unavailable``
    (5xx, 429, network, timeouts, after retries) or ``llm_bad_response`` (not a chat completion).
    None: the failure is the agent's (an unknown model, an adapter it broke, a refused request).
    ``status`` is the hard-coded tier's HTTP status, when there was one. ``outage`` is True for
    any such fault.
    """

    final = False  # True when asking again cannot help (a replay's changed request)

    def __init__(self, message: str, outage: bool = False, fault: str | None = None, status: int | None = None):
        super().__init__(message)
        if fault is None and outage:
            fault = "llm_unavailable"
        self.fault = fault
        self.status = status

    @property
    def outage(self) -> bool:
        return self.fault is not None


def is_simulated(provider) -> bool:
    """True for a provider whose answers move no money (a cassette, or a replay whose live model is one)."""
    return bool(getattr(provider, "simulated", False))


def provider_fault(tier: str, exc: ProviderError) -> str | None:
    """The outcome a provider failure stands for, or None when it may be the agent's doing."""
    if tier != "hardcoded":
        return None  # tiers 1 and 2 are code the agent wrote: their failures are its own
    return PROVIDER_FAULTS.get(getattr(exc, "kind", None) or "")


@dataclass
class LLMResult:
    content: str
    model: str
    tier: str
    cost: float
    truncated: bool
    input_tokens: int
    output_tokens: int
    finish_reason: str | None = None
    tool_calls: list[dict] = field(default_factory=list)  # flat calls (brainstem.llm.messages), when tools were offered
    cached_tokens: int = 0  # prompt tokens the provider read from its cache
    cache_write_tokens: int = 0  # prompt tokens it wrote to its cache
    sent_prompt: dict | None = None  # the user's turn as sent (cache markers and all), for a caller that goes on


class LLM:
    def __init__(self, *, models: Models, budget: Budget, record: Callable[..., dict], soul: str,
                 providers: Sequence[Provider], fallback_model: str | None = None,
                 on_cost: Callable[[float], None] | None = None, call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 meter=None, on_anomaly: Callable[[dict], None] | None = None,
                 stop: Callable[[], None] | None = None, screen: Callable[[str, bool], bool] | None = None):
        self.models = models
        self.budget = budget
        self.record = record
        self.soul = soul
        self.providers = list(providers)
        self.fallback_model = fallback_model
        self.on_cost = on_cost
        self.call_timeout = call_timeout
        self.on_anomaly = on_anomaly  # told of each call whose reported cost exceeds its worst case
        self.meter = meter  # a WireMeter: what sandboxed adapters send to the LLM host, priced and charged
        self.stop = stop  # raises when the session must stop (cancelled, its lease lost) before a call
        # True when a model's answer (or a host's error: the second argument says the client already masked
        # the key in it) holds secret text; the session records the stop and holds the agent. Such an
        # answer is booked, never used or recorded, whoever answered.
        self.screen = screen
        self._unknown_reported: set[str] = set()
        # By model: the prefixes (length in messages, key, lifetime, when) the latest calls wrote to the cache.
        self._written: dict[str, list[tuple[int, str, str, float]]] = {}

    # --- pricing ---
    def worst_case(self, model_id: str, prompt_chars: int, max_tokens: int, cache_ttls: frozenset[str] = frozenset()
                   ) -> float:
        """No cache hit assumed, and a request marked for caching (``cache_ttls``) written whole at its write price."""
        write = dearest_write(self.models.cache_prices(model_id), set(cache_ttls))
        return worst_case_cost(self.models, model_id, prompt_chars, max_tokens,
                               write_per_mtok=write if write is not None else 0.0)

    def _request_worst(self, model_id: str, request: dict) -> float:
        return self.worst_case(model_id, request_chars(request), request["max_tokens"],
                               frozenset(marked_ttls(request["messages"])))

    def actual_cost(self, model_id: str, resp: LLMResponse, tier: str, request: dict,
                    prompt_estimate: int | None = None) -> tuple[float, str]:
        """(what the call cost, where the figure came from).

        ``prompt_estimate`` (the runtime's own count of the prompt's tokens, given when the reported usage
        is implausibly below it: see :func:`implausible_prompt`) prices the prompt at the estimate, never
        below what the server reported it cost.

        The provider's ``usage.cost`` when it reports one, else the price list's cost of the reported
        tokens. A reply with no usage at all (some OpenAI-compatible servers send none) is never free:
        it is priced from the text that went in and came out, pessimistically (three characters a
        token), or at its worst case when reasoning was asked for, whose tokens the answer does not show.

        The hard-coded client's numbers come from the provider itself. An agent-written adapter's
        come from the agent, so they are never believed below the price list's cost of the text
        that actually went in and came out: an adapter that says "free" cannot get around the ceilings.
        """
        prompt_chars = request_chars(request)
        answer_chars = len(resp.content) + sum(len(c["name"]) + len(c["arguments"]) for c in resp.tool_calls)
        usage = resp.usage
        tokens_in, tokens_out = reported_prompt_tokens(usage), usage.get("completion_tokens", 0)
        read, written = cache_tokens(usage)
        ttls = marked_ttls(request.get("messages"))
        write = dearest_write(self.models.cache_prices(model_id), ttls) if ttls else None
        reported = usage.get("cost")
        has_cost = isinstance(reported, (int, float)) and not isinstance(reported, bool) and reported >= 0
        if tier not in TRUSTED_TIERS:
            # Nothing an adapter says was read from a cache makes its call cheaper.
            listed = listed_cost(self.models, model_id, max(tokens_in, prompt_chars // 4, prompt_estimate or 0),
                                 max(tokens_out, answer_chars // 4), 0, written, write)
            return (max(float(reported), listed), "provider") if has_cost else (listed, "price_list")
        if prompt_estimate is not None:
            listed = listed_cost(self.models, model_id, prompt_estimate, tokens_out)
            return max(float(reported), listed) if has_cost else listed, "estimated"
        # A cached call's bill is never believed below the operator's prices for the tokens reported. (A model
        # with no cache prices, that a server caches of its own accord, is booked at its bill as before.)
        cached = bool(ttls) or (self.models.cache_prices(model_id) is not None and bool(read or written))
        if has_cost and cached:
            return max(float(reported), listed_cost(self.models, model_id, tokens_in, tokens_out, read, written,
                                                    write)), "provider"
        if has_cost:
            return float(reported), "provider"
        if tokens_in or tokens_out:
            return listed_cost(self.models, model_id, tokens_in, tokens_out, read, written, write), "price_list"
        if request.get("reasoning"):
            return self._request_worst(model_id, request), "worst_case"
        return listed_cost(self.models, model_id, estimated_tokens(prompt_chars),
                           estimated_tokens(answer_chars)), "estimated"

    def resolve(self, name: str) -> str:
        model_id = self.models.resolve(name)
        if model_id is None:
            if name not in self._unknown_reported:
                self._unknown_reported.add(name)
                self.record(events.LLM_ERROR, error=f"unknown model {name!r}: not an alias or id in config:models",
                            model=name)
            raise LLMError(f"unknown model {name!r} (not in config:models)")
        return model_id

    # --- the call ---
    def call(self, *, purpose: str, model: str, prompt: str | Sequence[str] | None = None, max_tokens: int,
             effort: str | None = None, use_reserve: bool = False, step_id: str | None = None,
             history: Sequence[dict] = (), tools: Sequence[dict] | None = None,
             tool_choice: str | None = None, reuse: Reuse | None = None) -> LLMResult:
        """Ask ``model`` (alias or id); raises :class:`BudgetExceeded` or :class:`LLMError` (or what ``stop`` raises).

        The messages sent are the soul, ``history``, then ``prompt`` as the user's turn (a conversation
        that ends in tool results passes ``prompt=None``). ``tools`` (OpenAI function format) are offered
        with ``tool_choice``; the answer's calls are in :attr:`LLMResult.tool_calls`.

        ``reuse``: when the caller expects to send this request's prefix again. The prefix is the whole
        conversation, or, for a ``prompt`` given as parts (stable first, the volatile part last), everything
        before its last part. Where the model's cache prices say it pays, the prefix is marked for caching.
        """
        if self.stop is not None:
            self.stop()
        model_id = self.resolve(model)
        turn = {"history": history, "prompt": prompt, "tools": list(tools or ()), "tool_choice": tool_choice,
                "reuse": reuse}
        # The prompt is put together from the agent's own pieces (a plan's {{p0}}{{p1}}, stored results):
        # screened before it is sent or recorded, since karma would mask a guess where it matched.
        if self.screen is not None and self.screen(json.dumps(turn, default=str), False):
            refused = LLMError(f"the {purpose} call's prompt held secret text; it was not sent (secret_refused)")
            refused.final = True
            raise refused
        try:
            return self._call_model(purpose, model_id, turn, max_tokens, effort, use_reserve, step_id)
        except LLMError as first:
            fallback = self.models.resolve(self.fallback_model) if self.fallback_model else None
            # Out of credit is the account's, not the model's: another model's call would be one more after a 402.
            if fallback is None or fallback == model_id or first.final or first.fault == "llm_no_credit":
                raise
            self.record(events.MODEL_FALLBACK, purpose=purpose, step_id=step_id, model=model_id,
                        fallback_model=fallback, error=str(first))
            # The same conversation, tools and all: only the model changes.
            return self._call_model(purpose, fallback, turn, max_tokens, effort, use_reserve, step_id)

    def _call_model(self, purpose, model_id, turn: dict, max_tokens, effort, use_reserve, step_id) -> LLMResult:
        info = self.models.info(model_id)
        if info is not None and info.max_output_tokens:
            max_tokens = min(max_tokens, info.max_output_tokens)
        offered = {"tools": turn["tools"], "tool_choice": turn["tool_choice"] or "auto"} if turn["tools"] else {}
        messages, written = self._messages(model_id, turn, offered)
        prompt_chars = request_chars({"messages": messages, **offered})
        # Today's ceiling limits the call only when some provider tried may spend real money.
        simulated_only = all(is_simulated(p) for p in self.providers)
        max_tokens, reduced = self._fit_budget(purpose, step_id, model_id, prompt_chars, max_tokens, use_reserve,
                                               simulated_only, frozenset(marked_ttls(messages)))
        time_left = self.budget.time_left(use_reserve)
        if time_left <= 0:
            self.record(events.BUDGET_EXCEEDED, limit="time", purpose=purpose, step_id=step_id,
                        budget=self.budget.time_ceiling(use_reserve), spent=round(self.budget.elapsed(), 2))
            raise BudgetExceeded("time", f"no time left for the {purpose} call")
        request = {"model": model_id, "messages": messages, "max_tokens": max_tokens, **offered}
        if effort and info is not None and info.supports_reasoning:
            request["reasoning"] = {"effort": EFFORT_TO_REASONING.get(effort, "medium")}
        errors = []
        fault, status = None, None
        fallback = self.models.resolve(self.fallback_model) if self.fallback_model else None
        for provider in self.providers:
            t0 = time.monotonic()
            # The session's one deadline: each tier gets what is left of it, not a fresh allowance.
            time_left = self.budget.time_left(use_reserve)
            if time_left <= 0:
                self.record(events.BUDGET_EXCEEDED, limit="time", purpose=purpose, step_id=step_id,
                            budget=self.budget.time_ceiling(use_reserve), spent=round(self.budget.elapsed(), 2))
                raise BudgetExceeded("time", f"no time left for the {purpose} call")
            timeout = min(self.call_timeout, max(1.0, time_left))
            metered = self.meter is not None and provider.tier not in TRUSTED_TIERS
            wire = hold = None
            try:
                if metered:
                    # The adapter's own requests to the LLM host are priced, held, clamped and charged on the wire.
                    with self.meter.adapter_call(model=model_id, fallback=fallback, max_tokens=max_tokens,
                                                 use_reserve=use_reserve) as wire:
                        resp = provider.complete(request, timeout=timeout, deadline=t0 + max(1.0, time_left))
                else:
                    hold = self._hold(purpose, step_id, model_id, request, use_reserve, max(1.0, time_left),
                                      is_simulated(provider))
                    resp = provider.complete(request, timeout=timeout, deadline=t0 + max(1.0, time_left))
            except ProviderError as exc:
                self.budget.release(hold)
                said = self._screened_error(str(exc))
                self._record_failed_spend(purpose, step_id, model_id, provider.tier, wire, t0, said)
                errors.append(f"{provider.tier}: {said}")
                fault = provider_fault(provider.tier, exc)
                status = exc.status if provider.tier == "hardcoded" else status
                self.record(events.PROVIDER_FALLBACK, purpose=purpose, step_id=step_id, model=model_id,
                            tier=provider.tier, error=said,
                            duration_ms=int((time.monotonic() - t0) * 1000))
                continue
            except BudgetExceeded as exc:
                self.budget.release(hold)
                self._record_failed_spend(purpose, step_id, model_id, provider.tier, wire, t0, str(exc))
                raise
            except BaseException:
                self.budget.release(hold)
                raise
            held = self.screen is not None and self.screen(resp.content + json.dumps(resp.tool_calls), False)
            resp = dataclasses.replace(resp, content=WITHHELD, tool_calls=[]) if held else resp  # never shown
            try:
                result = self._account(purpose, step_id, model_id, provider.tier, request, resp, t0, reduced, wire,
                                       hold)
            finally:
                self.budget.release(hold)  # settled already, unless accounting failed
            if written is not None:
                self._written[model_id] = [written, *self._written.get(model_id, [])][:2]
            if held:
                error = LLMError(f"the model's answer to the {purpose} call held secret text; it was not used "
                                 f"(secret_refused)")
                error.final = True
                raise error
            return result
        failed = LLMError(f"every provider failed for {model_id}: " + " | ".join(errors), fault=fault, status=status)
        self.record(events.LLM_FAILED, purpose=purpose, step_id=step_id, model=model_id,
                    request=self._as_recorded(request), error=str(failed), fault=failed.fault, status=status)
        raise failed

    def _messages(self, model_id: str, turn: dict, offered: dict) -> tuple[list[dict], tuple | None]:
        """The messages to send, cache markers placed where they pay, and the prefix this request writes to the
        cache for the calls after it (None when it writes none)."""
        prompt = turn["prompt"]
        parts = [prompt] if isinstance(prompt, str) else [p for p in prompt if p] if prompt is not None else None
        messages = [{"role": "system", "content": self.soul}, *turn["history"]]
        if parts is not None:
            messages.append({"role": "user", "content": "".join(parts)})
        prices = self.models.cache_prices(model_id)
        if prices is None:
            # A conversation marked for another model (before a fallback) is not marked for one that caches nothing.
            return unmarked(messages), None
        ttl = ttl_that_pays(prices, turn["reuse"])
        at: dict[tuple[int, int], str] = {}
        last = len(messages) - 1
        if ttl is not None and parts is not None and len(parts) > 1:
            messages[last] = {**messages[last], "content": [{"type": "text", "text": p} for p in parts]}
            at.update({(last, j): ttl for j in range(len(parts) - 1)})
        elif ttl is not None and text_of(messages[last].get("content")):
            at[(last, len(as_parts(messages[last].get("content"))) - 1)] = ttl
        # What earlier calls of this session wrote and this request starts with: marked so it is read (a
        # conversation can grow past the provider's look-back for earlier cached prefixes).
        now = time.monotonic()
        for n, key, old_ttl, t in self._written.get(model_id, []):
            if len(at) >= MAX_MARKERS or n > last or now - t > TTL_SECONDS[old_ttl]:
                continue
            if prefix_key(model_id, offered, messages[:n]) == key and text_of(messages[n - 1].get("content")):
                at.setdefault((n - 1, len(as_parts(messages[n - 1].get("content"))) - 1), old_ttl)
        written = None
        if ttl is not None and at.get((last, len(as_parts(messages[last].get("content"))) - 1)) == ttl:
            written = (last + 1, prefix_key(model_id, offered, messages), ttl, now)
        return mark(messages, at), written

    def _as_recorded(self, request: dict) -> dict:
        """``request`` as karma keeps it: the soul is in every request, so karma notes it rather than
        repeating it each time; the tools' schemas are their metas, in the store, so karma names them."""
        recorded = dict(request)
        recorded["messages"] = [{"role": "system", "content": f"[soul: {len(self.soul)} chars]"},
                                *request["messages"][1:]]
        if request.get("tools"):
            recorded["tools"] = [t.get("function", {}).get("name") for t in request["tools"]]
        return recorded

    def _screened_error(self, said: str) -> str:
        """A host's error as it may be recorded: it may quote the request (a moderation error quoting its
        input), text the agent put together, so it is screened as an answer is, never masked where it matched."""
        if self.screen is not None and self.screen(said, REDACTED in said):
            return WITHHELD_ERROR
        return said

    def _record_failed_spend(self, purpose, step_id, model_id, tier, wire, t0, error) -> None:
        """An adapter that failed after its requests were billed: the spend is in an llm_call entry too,
        so a session's cost stays the sum of its llm_call entries."""
        if wire and wire["requests"]:
            self.record(events.LLM_CALL, purpose=purpose, step_id=step_id, model=model_id, tier=tier,
                        cost=round(wire["cost"], 10), cost_source="wire", wire_requests=wire["requests"],
                        failed=True, error=error, duration_ms=int((time.monotonic() - t0) * 1000))

    def _fit_budget(self, purpose, step_id, model_id, prompt_chars, max_tokens, use_reserve,
                    simulated: bool = False, ttls: frozenset[str] = frozenset()) -> tuple[int, bool]:
        left, limit = self.budget.headroom(use_reserve, simulated=simulated)
        # Nothing left is a stop whatever the price list says: a model priced at zero must not make
        # the ceiling stop working.
        if left > 0 and self.worst_case(model_id, prompt_chars, max_tokens, ttls) <= left:
            return max_tokens, False
        p_out = self.models.prices(model_id)[1]
        input_cost = self.worst_case(model_id, prompt_chars, 0, ttls)
        affordable = math.floor((left - input_cost) * 1e6 / p_out) if p_out > 0 else max_tokens
        if left > 0 and affordable >= min(MIN_USEFUL_TOKENS, max_tokens):
            return min(affordable, max_tokens), True
        self._refused(limit, purpose, step_id, model_id, self.worst_case(model_id, prompt_chars, max_tokens, ttls),
                      use_reserve, left)
        raise BudgetExceeded(limit, f"the {purpose} call could cost more than the {dollars(max(0.0, left))} left"
                                    + (" of today's ceiling" if limit == "daily" else ""))

    def _refused(self, limit, purpose, step_id, model_id, worst, use_reserve, left=None) -> None:
        if limit == "daily" and self.budget.daily is not None:
            ceiling = self.budget.daily.ceiling
            spent = ceiling - (self.budget.daily.left() if left is None else left)  # today's, with holds
        else:
            ceiling, spent = self.budget.cost_ceiling(use_reserve), self.budget.spent
        self.record(events.BUDGET_EXCEEDED, limit=limit, purpose=purpose, step_id=step_id, model=model_id,
                    spent=round(spent, 6), budget=round(ceiling, 6), worst_case=round(worst, 6))

    def _hold(self, purpose, step_id, model_id, request, use_reserve, time_left, simulated: bool = False):
        """The call's worst case, held until it is answered (the provider has until ``time_left`` runs out)."""
        worst = self._request_worst(model_id, request)
        try:
            return self.budget.reserve(worst, use_reserve=use_reserve, ttl_s=time_left + HOLD_MARGIN_S,
                                       simulated=simulated)
        except BudgetExceeded as exc:
            self._refused(exc.limit, purpose, step_id, model_id, worst, use_reserve)
            raise BudgetExceeded(exc.limit, f"the {purpose} call was not sent: {exc}") from None

    def _account(self, purpose, step_id, model_id, tier, request, resp: LLMResponse, t0, reduced,
                 wire: dict | None = None, hold=None) -> LLMResult:
        # Rounded once, here, to 1e-10 USD: what is added to the budget is exactly what karma records,
        # so a session's cost is the sum of its llm_call entries.
        if wire and wire["requests"]:
            # Charged request by request on the wire (the budget and today's spend have it already);
            # what the adapter says it cost is never believed.
            cost, cost_source, charge = round(wire["cost"], 10), "wire", False
        else:
            estimate = implausible_prompt(resp.usage, request_chars(request))
            if estimate is not None:
                self.record(events.USAGE_IMPLAUSIBLE, purpose=purpose, step_id=step_id, model=model_id, tier=tier,
                            reported_prompt_tokens=reported_prompt_tokens(resp.usage),
                            estimated_prompt_tokens=estimate)
            cost, cost_source = self.actual_cost(model_id, resp, tier, request, estimate)
            cost, charge = round(cost, 10), True
        if charge:
            self.budget.settle(hold, cost)  # the session's spend and today's, in place of the worst case held
        recorded_request = self._as_recorded(request)
        read, written = cache_tokens(resp.usage)
        self.record(events.LLM_CALL, purpose=purpose, step_id=step_id, model=model_id, tier=tier,
                    input_tokens=reported_prompt_tokens(resp.usage),
                    output_tokens=resp.usage.get("completion_tokens", 0),
                    cached_tokens=read or None, cache_write_tokens=written or None,
                    reasoning_tokens=resp.usage.get("reasoning_tokens", 0), cost=cost,
                    cost_source=cost_source, wire_requests=wire["requests"] if wire else None,
                    duration_ms=int((time.monotonic() - t0) * 1000), truncated=resp.truncated,
                    finish_reason=resp.finish_reason, max_tokens_reduced_to_fit_budget=reduced or None,
                    simulated=True if hold is not None and hold.simulated else None,
                    request=recorded_request, response=resp.content, tool_calls=resp.tool_calls or None)
        if charge:
            # Charged as billed, never less; above what was reserved, it is flagged for the operator.
            worst = self._request_worst(model_id, request)
            flag_overrun(self.record, self.on_anomaly, cost=cost, worst=worst, source=cost_source, model=model_id,
                         tier=tier, purpose=purpose)
            if self.on_cost is not None:
                self.on_cost(cost)
        sent = request["messages"][-1] if request["messages"][-1].get("role") == "user" else None
        return LLMResult(content=resp.content, model=model_id, tier=tier, cost=cost, truncated=resp.truncated,
                         input_tokens=reported_prompt_tokens(resp.usage),
                         output_tokens=resp.usage.get("completion_tokens", 0), finish_reason=resp.finish_reason,
                         tool_calls=list(resp.tool_calls), cached_tokens=read, cache_write_tokens=written,
                         sent_prompt=sent)
